package coordinator

import (
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// closingTransport wraps memberlist's transport so that its Shutdown also
// closes every stream connection this node dialed. memberlist's own
// Shutdown leaves them be, so a Join or push/pull stuck on a peer that
// accepts TCP and never answers would hold Close up for TCPTimeout.
type closingTransport struct {
	memberlist.NodeAwareTransport

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// newTransport returns mc's transport wrapped, making memberlist's default
// network transport when mc has none (and setting mc's ports when it binds
// a free one).
func newTransport(mc *memberlist.Config, logger *log.Logger) (*closingTransport, error) {
	t := mc.Transport
	if t == nil {
		nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: logger}
		var (
			nt  *memberlist.NetTransport
			err error
		)
		// A free TCP port may be taken for UDP: try a few (as memberlist does).
		for range 10 {
			if nt, err = memberlist.NewNetTransport(nc); err == nil || mc.BindPort != 0 {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("coordinator: gossip transport: %w", err)
		}
		if mc.BindPort == 0 {
			mc.BindPort = nt.GetAutoBindPort()
			if mc.AdvertisePort == 0 {
				mc.AdvertisePort = mc.BindPort
			}
		}
		t = nt
	}
	na, ok := t.(memberlist.NodeAwareTransport)
	if !ok {
		na = addressTransport{t}
	}
	return &closingTransport{NodeAwareTransport: na, conns: make(map[net.Conn]struct{})}, nil
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

// DialTimeout implements memberlist.Transport.
func (t *closingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.track(t.NodeAwareTransport.DialTimeout(addr, timeout))
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *closingTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.track(t.NodeAwareTransport.DialAddressTimeout(addr, timeout))
}

// Shutdown implements memberlist.Transport.
func (t *closingTransport) Shutdown() error {
	err := t.NodeAwareTransport.Shutdown()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	clear(t.conns)
	return err
}

type trackedConn struct {
	net.Conn
	t    *closingTransport
	once sync.Once
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
