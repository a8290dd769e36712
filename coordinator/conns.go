package coordinator

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// closingTransport wraps memberlist's transport so that its Shutdown also
// ends every stream this node dialed or accepted and every dial in
// progress. memberlist's own Shutdown leaves them be, so a Join or
// push/pull stuck on a peer that accepts TCP and never answers, or whose
// handshake never completes, would hold Join, Start and the loop's workers
// up for TCPTimeout, and a peer that opened a stream and went silent would
// keep memberlist's handler of it running as long after Close.
type closingTransport struct {
	memberlist.NodeAwareTransport
	// netDial is set when the transport is ours or memberlist's
	// NetTransport: its dial is then made here, under ctx, which Shutdown
	// cancels.
	netDial bool

	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc

	streams chan net.Conn // accepted streams, tracked, for memberlist
	stopFwd chan struct{} // closed once the inner transport is shut down
	fwdDone chan struct{} // closed when forward returns

	sent *traffic // counts the bytes this node sends

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
	stopOnce sync.Once
}

// newTransport returns mc's transport wrapped, making our network
// transport (netTransport: memberlist's NetTransport, with a buffer per
// packet of its size) when mc has none, and setting mc's ports when it
// binds a free one.
func newTransport(mc *memberlist.Config, logger *log.Logger, sent *traffic) (*closingTransport, error) {
	t := mc.Transport
	_, isNet := t.(*memberlist.NetTransport)
	if t == nil {
		nt, err := listenNetTransport(mc.BindAddr, mc.BindPort, logger)
		if err != nil {
			return nil, fmt.Errorf("coordinator: gossip transport: %w", err)
		}
		if mc.BindPort == 0 {
			mc.BindPort = nt.port()
			if mc.AdvertisePort == 0 {
				mc.AdvertisePort = mc.BindPort
			}
		}
		t, isNet = nt, true
	}
	na, ok := t.(memberlist.NodeAwareTransport)
	if !ok {
		na = addressTransport{t}
	}
	ct := &closingTransport{
		NodeAwareTransport: na,
		netDial:            isNet,
		sent:               sent,
		conns:              make(map[net.Conn]struct{}),
		streams:            make(chan net.Conn),
		stopFwd:            make(chan struct{}),
		fwdDone:            make(chan struct{}),
	}
	ct.ctx, ct.cancel = context.WithCancel(context.Background())
	go ct.forward(na.StreamCh())
	return ct, nil
}

// StreamCh implements memberlist.Transport: the inner transport's
// accepted streams, tracked so Shutdown closes them.
func (t *closingTransport) StreamCh() <-chan net.Conn { return t.streams }

// forward hands the inner transport's streams to memberlist. It drains
// them until the inner transport is shut down (whose listener may be
// handing one over), closing those that come after Shutdown began.
func (t *closingTransport) forward(in <-chan net.Conn) {
	defer close(t.fwdDone)
	for {
		select {
		case c := <-in:
			tc, err := t.track(c, nil)
			if err != nil {
				continue // closed by track
			}
			select {
			case t.streams <- tc:
			case <-t.stopFwd:
				tc.Close()
				return
			}
		case <-t.stopFwd:
			return
		}
	}
}

func (t *closingTransport) track(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	t.conns[c] = struct{}{}
	return &trackedConn{Conn: c, t: t}, nil
}

// WriteToAddress implements memberlist.NodeAwareTransport, counting the
// bytes sent.
func (t *closingTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	at, err := t.NodeAwareTransport.WriteToAddress(b, addr)
	if err == nil {
		t.sent.packetBytes.Add(uint64(len(b)))
	}
	return at, err
}

// WriteTo implements memberlist.Transport, counting the bytes sent.
func (t *closingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// DialTimeout implements memberlist.Transport.
func (t *closingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. A dial in
// progress ends at Shutdown. A network transport's dial is made here under a
// context Shutdown cancels (what NetTransport does, plus the context).
// Another transport's dial can't be cancelled: it runs on, and the
// connection it returns after Shutdown is closed at once, but the caller
// is answered net.ErrClosed at Shutdown.
//
// A dialed connection gets a deadline of timeout (memberlist's TCPTimeout)
// from the dial: memberlist sets one itself for a push/pull, but not for
// SendReliable, whose write to a peer that accepts and never reads (a
// paused process) would otherwise block the digest exchange's sender until
// Close.
func (t *closingTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.dial(addr, timeout)
	if err == nil && timeout > 0 {
		_ = c.SetDeadline(time.Now().Add(timeout)) // a conn that has none is closed at Shutdown
	}
	return c, err
}

func (t *closingTransport) dial(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.netDial {
		d := net.Dialer{Timeout: timeout}
		return t.track(d.DialContext(t.ctx, "tcp", addr.Addr))
	}
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, err := t.track(t.NodeAwareTransport.DialAddressTimeout(addr, timeout))
		ch <- dialed{c, err}
	}()
	select {
	case d := <-ch:
		return d.c, d.err
	case <-t.ctx.Done():
		// The connection, if one comes, is closed: by Shutdown if it was
		// tracked before, by track if after.
		return nil, net.ErrClosed
	}
}

// Shutdown implements memberlist.Transport.
func (t *closingTransport) Shutdown() error {
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	clear(t.conns)
	t.mu.Unlock()
	t.cancel()
	err := t.NodeAwareTransport.Shutdown()
	t.stopOnce.Do(func() { close(t.stopFwd) })
	<-t.fwdDone
	return err
}

type trackedConn struct {
	net.Conn
	t    *closingTransport
	once sync.Once
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.t.sent.streamBytes.Add(uint64(n))
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c.Conn)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

// addressTransport adapts a plain memberlist.Transport.
type addressTransport struct{ memberlist.Transport }

func (a addressTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	return a.WriteTo(b, addr.Addr)
}

func (a addressTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return a.DialTimeout(addr.Addr, timeout)
}
