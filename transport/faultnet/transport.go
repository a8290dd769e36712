package faultnet

import (
	"container/heap"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

const (
	// loopback is the only address a Transport binds.
	loopback = "127.0.0.1"

	// maxQueuedPackets bounds the packets a Transport holds for its
	// receiver (delayed, or waiting for memberlist to read them); beyond
	// it packets are dropped and counted, like a full socket buffer.
	maxQueuedPackets = 4096

	// bindAttempts bounds the retries when the kernel's free TCP port is
	// taken for UDP (memberlist retries the same way).
	bindAttempts = 10
)

// TransportConfig configures one Transport.
type TransportConfig struct {
	// BindPort is the UDP and TCP port bound on 127.0.0.1. The default, 0,
	// lets the kernel pick a free port, which is what tests should use; a
	// fixed port can collide with other tests running at the same time.
	BindPort int

	// Logger receives, at level Error, the errors the underlying
	// memberlist.NetTransport logs (failed reads and accepts). nil
	// discards them.
	Logger *slog.Logger
}

// Validate reports whether c is usable. It does not modify c.
func (c TransportConfig) Validate() error {
	if c.BindPort < 0 || c.BindPort > 65535 {
		return fmt.Errorf("%w: bind port %d is not within [0, 65535]", ErrInvalid, c.BindPort)
	}
	return nil
}

// Transport is a memberlist.NodeAwareTransport for one node: a real
// memberlist.NetTransport bound to 127.0.0.1 (UDP and TCP) whose traffic
// passes the faults of its Network. Set it as memberlist.Config.Transport;
// memberlist calls Shutdown from its own Shutdown.
//
// Packets are checked when sent (the sender's WriteTo reports success for a
// dropped packet, as UDP does) and again when delivered to the receiver, so
// a fault set while a packet is delayed still stops it. Stream dials blocked
// by a fault fail at once with an error wrapping ErrLinkDown.
//
// All methods are safe for concurrent use.
type Transport struct {
	net   *Network
	name  string
	inner *memberlist.NetTransport
	addr  netip.AddrPort

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn

	closed   atomic.Bool
	stopping chan struct{} // closed first by Shutdown: stop delivering
	stopped  chan struct{} // closed once the inner listeners have exited
	wg       sync.WaitGroup
	once     sync.Once
	err      error

	mu    sync.Mutex
	conns map[*trackedConn]struct{} // open streams, closed by Shutdown
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Transport binds a new Transport for node name on 127.0.0.1 and records
// its address, so faults naming the node apply to it. A later Transport
// under the same name (a restart, usually on a new port) becomes the one
// Addr returns; faults naming the node apply to every live Transport of
// that name. The caller must call Shutdown (memberlist's Shutdown does).
func (n *Network) Transport(name string, cfg TransportConfig) (*Transport, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty node name", ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := log.New(io.Discard, "", 0)
	if cfg.Logger != nil {
		logger = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError)
	}
	inner, err := bind(loopback, cfg.BindPort, logger)
	if err != nil {
		return nil, fmt.Errorf("faultnet: node %q: %w", name, err)
	}
	t := &Transport{
		net:      n,
		name:     name,
		inner:    inner,
		addr:     netip.AddrPortFrom(netip.MustParseAddr(loopback), uint16(inner.GetAutoBindPort())),
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		stopping: make(chan struct{}),
		stopped:  make(chan struct{}),
		conns:    make(map[*trackedConn]struct{}),
	}
	n.register(t)
	t.wg.Add(2)
	go t.pumpPackets()
	go t.pumpStreams()
	return t, nil
}

// bind creates a NetTransport on host:port, retrying when port is 0 and
// the port the kernel chose for TCP is taken for UDP.
func bind(host string, port int, logger *log.Logger) (*memberlist.NetTransport, error) {
	attempts := 1
	if port == 0 {
		attempts = bindAttempts
	}
	var err error
	for range attempts {
		var nt *memberlist.NetTransport
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{host},
			BindPort:  port,
			Logger:    logger,
		})
		if err == nil {
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

// Name returns the node name the Transport was created for.
func (t *Transport) Name() string { return t.name }

// Addr returns the bound "127.0.0.1:port" address, the one to join.
func (t *Transport) Addr() string { return t.addr.String() }

// Port returns the bound port.
func (t *Transport) Port() int { return int(t.addr.Port()) }

// FinalAdvertiseAddr implements memberlist.Transport. The Transport can
// only advertise the address it is bound to: an empty ip means that
// address, and any other ip and port must equal it (port 0 is accepted).
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	bound := net.IP(t.addr.Addr().AsSlice())
	if ip == "" {
		return bound, t.Port(), nil
	}
	parsed := net.ParseIP(ip)
	if parsed == nil || !parsed.Equal(bound) || (port != 0 && port != t.Port()) {
		return nil, 0, fmt.Errorf("%w: node %q can only advertise its bound address %s, not %s",
			ErrInvalid, t.name, t.addr, net.JoinHostPort(ip, fmt.Sprint(port)))
	}
	return bound, t.Port(), nil
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport. A packet
// dropped by a fault is reported as sent.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.closed.Load() {
		return time.Time{}, fmt.Errorf("write to %s: %w", a.Addr, ErrClosed)
	}
	if !t.net.sendPacket(t.name, a.Addr) {
		return time.Now(), nil
	}
	return t.inner.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. The stream
// is refused at once, with an error wrapping ErrLinkDown, when a fault
// stops traffic between the two nodes in either direction.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.closed.Load() {
		return nil, fmt.Errorf("dial %s: %w", a.Addr, ErrClosed)
	}
	if err := t.net.dialCheck(t.name, a.Addr); err != nil {
		return nil, err
	}
	conn, err := t.inner.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	tc := t.track(conn, t.net.trackDialer(conn.LocalAddr(), t.name))
	if tc == nil {
		return nil, fmt.Errorf("dial %s: %w", a.Addr, ErrClosed)
	}
	return tc, nil
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport. It closes the sockets and every
// open stream, drops queued packets and returns once all the Transport's
// goroutines have exited, so the node vanishes as in a crash. It is
// idempotent.
func (t *Transport) Shutdown() error {
	t.once.Do(func() {
		t.closed.Store(true)
		close(t.stopping)
		// The pumps keep draining the inner channels until the inner
		// listeners have exited, so they can't block on a send.
		t.err = t.inner.Shutdown()
		close(t.stopped)
		t.wg.Wait()
		t.mu.Lock()
		conns := t.conns
		t.conns = nil
		t.mu.Unlock()
		for c := range conns {
			_ = c.Conn.Close()
			c.once.Do(c.release)
		}
		t.net.unregister(t)
	})
	return t.err
}

// track wraps conn so that Shutdown closes it, or closes it and returns nil
// when the Transport is already shut down. release runs once when the
// stream closes.
func (t *Transport) track(conn net.Conn, release func()) *trackedConn {
	tc := &trackedConn{Conn: conn}
	tc.release = func() {
		release()
		t.mu.Lock()
		delete(t.conns, tc)
		t.mu.Unlock()
	}
	t.mu.Lock()
	if t.conns == nil {
		t.mu.Unlock()
		_ = conn.Close()
		release()
		return nil
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc
}

// trackedConn is a stream that forgets its bookkeeping when closed.
type trackedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the stream.
func (c *trackedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// delayed is a received packet waiting out the network delay.
type delayed struct {
	p   *memberlist.Packet
	due time.Time
	seq uint64 // arrival order, to break ties
}

// delayQueue is a min-heap of delayed packets by due time.
type delayQueue []delayed

func (q delayQueue) Len() int { return len(q) }
func (q delayQueue) Less(i, j int) bool {
	if q[i].due.Equal(q[j].due) {
		return q[i].seq < q[j].seq
	}
	return q[i].due.Before(q[j].due)
}
func (q delayQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *delayQueue) Push(x any)   { *q = append(*q, x.(delayed)) }
func (q *delayQueue) Pop() any {
	old := *q
	last := old[len(old)-1]
	old[len(old)-1] = delayed{}
	*q = old[:len(old)-1]
	return last
}

// pumpPackets moves packets from the inner transport to PacketCh, holding
// each for the network delay and checking the faults when it is due.
func (t *Transport) pumpPackets() {
	defer t.wg.Done()
	in := t.inner.PacketCh()
	stopping := t.stopping
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var (
		waiting delayQueue
		ready   []*memberlist.Packet
		seq     uint64
		closing bool
	)
	arm := func() {
		if len(waiting) == 0 {
			timer.Stop()
			return
		}
		timer.Reset(time.Until(waiting[0].due))
	}
	for {
		var out chan<- *memberlist.Packet
		var head *memberlist.Packet
		if len(ready) > 0 {
			out, head = t.packetCh, ready[0]
		}
		select {
		case p := <-in:
			if closing {
				continue
			}
			if len(waiting)+len(ready) >= maxQueuedPackets {
				t.net.dropOverflow()
				continue
			}
			d := t.net.packetDelay()
			if d <= 0 {
				if t.net.deliverPacket(p.From, t.name) {
					ready = append(ready, p)
				}
				continue
			}
			seq++
			heap.Push(&waiting, delayed{p: p, due: p.Timestamp.Add(d), seq: seq})
			arm()
		case out <- head:
			ready[0] = nil
			ready = ready[1:]
		case <-timer.C:
			now := time.Now()
			for len(waiting) > 0 && !waiting[0].due.After(now) {
				e := heap.Pop(&waiting).(delayed)
				if t.net.deliverPacket(e.p.From, t.name) {
					// The receive time is the delivery time, so
					// memberlist's RTT measurements see the delay.
					e.p.Timestamp = now
					ready = append(ready, e.p)
				}
			}
			arm()
		case <-stopping:
			closing, stopping = true, nil
			waiting, ready = nil, nil
			timer.Stop()
		case <-t.stopped:
			return
		}
	}
}

// pumpStreams moves accepted streams from the inner transport to StreamCh,
// closing those a fault forbids.
func (t *Transport) pumpStreams() {
	defer t.wg.Done()
	in := t.inner.StreamCh()
	stopping := t.stopping
	var (
		pending net.Conn
		closing bool
	)
	for {
		var out chan<- net.Conn
		recv := in
		if pending != nil {
			out, recv = t.streamCh, nil
		}
		select {
		case c := <-recv:
			if closing || !t.net.acceptStream(c.RemoteAddr(), t.name) {
				_ = c.Close()
				continue
			}
			if tc := t.track(c, func() {}); tc != nil {
				pending = tc
			}
		case out <- pending:
			pending = nil
		case <-stopping:
			closing, stopping = true, nil
			if pending != nil {
				_ = pending.Close()
				pending = nil
			}
		case <-t.stopped:
			return
		}
	}
}
