package kvnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file is the machinery of Node.Cut: a cut enforced in the node's own
// gossip transport and gRPC dialer, not a kernel firewall, so tests and
// demos can partition a cluster of processes without root.

// errNoFaultControl is returned by Node.Cut when the node was started
// without Config.FaultControl.
var errNoFaultControl = errors.New("kvnode: fault control is off (Config.FaultControl, flag -fault-control)")

// cutSet is the set of peers this node is cut off from. It is safe for
// concurrent use.
type cutSet struct {
	mu      sync.Mutex
	gossip  map[netip.AddrPort]bool
	service map[string]bool     // gRPC addresses of the cut peers
	conns   map[*cutConn]string // open outbound gRPC connections, by address
	dialer  net.Dialer
}

func newCutSet() *cutSet { return &cutSet{conns: map[*cutConn]string{}} }

// parseGossipAddr parses "ip:port" (a literal IP: memberlist addresses
// peers by IP) into the form packets arrive from.
func parseGossipAddr(s string) (netip.AddrPort, error) {
	a, err := netip.ParseAddrPort(strings.TrimSpace(s))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("kvnode: peer %q: want a gossip address ip:port: %w", s, err)
	}
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()), nil
}

// set replaces the cut: gossip addresses and the gRPC addresses of the same
// peers. Open gRPC connections to newly cut addresses are closed.
func (s *cutSet) set(gossip []netip.AddrPort, service []string) {
	s.mu.Lock()
	s.gossip, s.service = map[netip.AddrPort]bool{}, map[string]bool{}
	for _, a := range gossip {
		s.gossip[a] = true
	}
	for _, a := range service {
		s.service[a] = true
	}
	var doomed []*cutConn
	for c, addr := range s.conns {
		if s.service[addr] {
			doomed = append(doomed, c)
		}
	}
	s.mu.Unlock()
	for _, c := range doomed {
		_ = c.Close()
	}
}

func (s *cutSet) gossipCut(a netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gossip[netip.AddrPortFrom(a.Addr().Unmap(), a.Port())]
}

// addrCut reports whether memberlist's peer address (ip:port) is cut.
func (s *cutSet) addrCut(addr string) bool {
	a, err := netip.ParseAddrPort(addr)
	return err == nil && s.gossipCut(a)
}

// dial is the router's gRPC dialer (grpc.WithContextDialer).
func (s *cutSet) dial(ctx context.Context, addr string) (net.Conn, error) {
	s.mu.Lock()
	cut := s.service[addr]
	s.mu.Unlock()
	if cut {
		return nil, fmt.Errorf("kvnode: %s is cut off (fault control)", addr)
	}
	conn, err := s.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &cutConn{Conn: conn, set: s}
	s.mu.Lock()
	s.conns[c] = addr
	s.mu.Unlock()
	return c, nil
}

// cutConn is an outbound gRPC connection the cut can close.
type cutConn struct {
	net.Conn
	set  *cutSet
	once sync.Once
}

func (c *cutConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// cutTransport is memberlist's NetTransport with the cut applied: a
// memberlist.NodeAwareTransport set as the coordinator's
// Config.Memberlist.Transport. memberlist calls Shutdown.
type cutTransport struct {
	inner *memberlist.NetTransport
	cut   *cutSet

	packetCh chan *memberlist.Packet
	stopping chan struct{} // closed by Shutdown: deliver nothing more
	stopped  chan struct{} // closed once the inner listeners have exited
	wg       sync.WaitGroup
	once     sync.Once
}

var _ memberlist.NodeAwareTransport = (*cutTransport)(nil)

// newCutTransport binds host:port (UDP and TCP) for gossip. With port 0 it
// retries when the port the kernel chose for TCP is taken for UDP, as
// memberlist does for its own transport.
func newCutTransport(host string, port int, cut *cutSet, logger *slog.Logger) (*cutTransport, error) {
	attempts := 1
	if port == 0 {
		attempts = 10
	}
	var inner *memberlist.NetTransport
	var err error
	for range attempts {
		inner, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{host},
			BindPort:  port,
			Logger:    slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		})
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kvnode: bind gossip %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	t := &cutTransport{
		inner:    inner,
		cut:      cut,
		packetCh: make(chan *memberlist.Packet),
		stopping: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	t.wg.Add(1)
	go t.pumpPackets()
	return t, nil
}

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *cutTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport.
func (t *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport. A packet to a
// cut peer is dropped and reported as sent, as a lost UDP packet is.
func (t *cutTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.cut.addrCut(a.Addr) {
		return time.Now(), nil
	}
	return t.inner.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport.
func (t *cutTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport: a dial to a
// cut peer fails at once.
func (t *cutTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.cut.addrCut(a.Addr) {
		return nil, fmt.Errorf("kvnode: gossip to %s is cut off (fault control)", a.Addr)
	}
	return t.inner.DialAddressTimeout(a, timeout)
}

// StreamCh implements memberlist.Transport. Accepted streams are not
// filtered: their source port does not tell which peer dialed.
func (t *cutTransport) StreamCh() <-chan net.Conn { return t.inner.StreamCh() }

// Shutdown implements memberlist.Transport: it closes the sockets and
// returns once the transport's goroutines have ended.
func (t *cutTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		close(t.stopping)
		// The pump keeps draining the inner packet channel until the
		// listeners have exited, so they never block on a send.
		err = t.inner.Shutdown()
		close(t.stopped)
		t.wg.Wait()
	})
	return err
}

// pumpPackets passes received packets to memberlist, except those from a
// cut peer (a packet's source is the peer's gossip address).
func (t *cutTransport) pumpPackets() {
	defer t.wg.Done()
	for {
		select {
		case p := <-t.inner.PacketCh():
			if a, ok := p.From.(*net.UDPAddr); ok && t.cut.gossipCut(a.AddrPort()) {
				continue
			}
			select {
			case t.packetCh <- p:
			case <-t.stopping:
			}
		case <-t.stopped:
			return
		}
	}
}
