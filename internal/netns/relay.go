//go:build linux

package netns

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
)

// A Relay listens inside a node's namespace and forwards each connection
// to a target in the root namespace: a service on the host's loopback
// (PostgreSQL, say) becomes a node of the network, which faults can cut
// like any other. It is the network's only way out, one port to one
// target.
type Relay struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Relay starts a relay on a free port of node's address to target, a
// host:port dialed from the root namespace.
func (n *Net) Relay(node, target string) (*Relay, error) {
	r := &Relay{target: target, conns: map[net.Conn]struct{}{}}
	err := n.Do(node, func() error {
		var err error
		r.ln, err = net.Listen("tcp", netip.AddrPortFrom(n.Addr(node), 0).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: relay on %s: %w", node, err)
	}
	r.wg.Go(r.accept)
	return r, nil
}

// Addr is the relay's host:port on the network.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, closes every relayed connection and waits for
// the relay's goroutines. It is idempotent.
func (r *Relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	err := r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

// track records c so that Close closes it; it reports false, closing c,
// if the relay is closed already.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			return
		}
		r.wg.Go(func() { r.serve(c) })
	}
}

// serve copies both ways between c and a new connection to the target
// until either side ends; then both are closed.
func (r *Relay) serve(c net.Conn) {
	defer r.untrack(c)
	t, err := net.Dial("tcp", r.target)
	if err != nil || !r.track(t) {
		if t != nil {
			t.Close()
		}
		return
	}
	defer r.untrack(t)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(t, c)
	go pipe(c, t)
	<-done // one side ended: the deferred closes end the other copy
	r.untrack(c)
	r.untrack(t)
	<-done
}
