package faultctl

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
)

// This file is the machinery of Control.Cut: a cut enforced in the node's
// own gossip transport (a faultnet.Filter) and gRPC dialer, not a kernel
// firewall, so tests and demos can partition a cluster of processes
// without root.

// cutSet is the set of peers a node is cut off from. It is safe for
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
		return netip.AddrPort{}, fmt.Errorf("faultctl: peer %q: want a gossip address ip:port: %w", s, err)
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

// blocked reports whether the gossip peer at a is cut (faultnet.Filter's
// test).
func (s *cutSet) blocked(a netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gossip[a]
}

// dial is the router's gRPC dialer (grpc.WithContextDialer).
func (s *cutSet) dial(ctx context.Context, addr string) (net.Conn, error) {
	s.mu.Lock()
	cut := s.service[addr]
	s.mu.Unlock()
	if cut {
		return nil, fmt.Errorf("faultctl: %s is cut off", addr)
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

// splitPeers splits a list of addresses separated by commas or blanks.
func splitPeers(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
}
