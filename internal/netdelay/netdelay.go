package netdelay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A Proxy accepts connections on its address and relays each to the
// target, delaying both directions.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and relays to target (a loopback
// host:port) with delay added to each direction: a round trip through the
// proxy takes 2*delay more than without it.
func Start(target string, delay time.Duration) (*Proxy, error) {
	if err := check(target, delay); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netdelay: listen: %w", err)
	}
	return Serve(ln, target, delay)
}

// Serve is Start on a listener of the caller's: one in a test's network
// namespace, say (internal/netns), which the caller made and so knows
// to be the test's own. The proxy closes ln.
func Serve(ln net.Listener, target string, delay time.Duration) (*Proxy, error) {
	if err := check(target, delay); err != nil {
		ln.Close()
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// check refuses a negative delay and a target off loopback.
func check(target string, delay time.Duration) error {
	if delay < 0 {
		return fmt.Errorf("netdelay: negative delay %v", delay)
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("netdelay: target %q: %w", target, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("netdelay: target %q is not a loopback address", target)
	}
	return nil
}

// Addr is the proxy's host:port, to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every relayed connection and waits for the
// proxy's goroutines to end. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track records c so that Close closes it; it reports false, closing c,
// if the proxy is closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.relay(c) })
	}
}

// relay dials the target for the client connection c and pumps both ways
// until both directions have ended.
func (p *Proxy) relay(c net.Conn) {
	defer p.untrack(c)
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil || !p.track(s) {
		return
	}
	defer p.untrack(s)
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(s, c) })
	p.pump(c, s)
	wg.Wait()
}

// chunk is bytes read at a time.
type chunk struct {
	b   []byte
	due time.Time
}

// queued bounds the chunks a direction holds, read but not yet due: up to
// 2 MiB beyond the kernel's buffers, after which the reader waits.
const queued = 64

// pump copies from src to dst, each chunk written at its due time: when it
// was read, plus the delay. When src ends cleanly it closes dst for
// writing, so that a half-closed connection stays open the other way; when
// either side fails it closes both, which ends the other direction too.
func (p *Proxy) pump(dst, src net.Conn) {
	q := make(chan chunk, queued)
	var (
		wg      sync.WaitGroup
		readErr error
	)
	wg.Go(func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now().Add(p.delay)}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	})
	t := time.NewTimer(0)
	defer t.Stop()
	failed := false
	for ch := range q {
		if failed {
			continue // drain, so the reader ends
		}
		if d := time.Until(ch.due); d > 0 {
			t.Reset(d)
			<-t.C
		}
		if _, err := dst.Write(ch.b); err != nil {
			failed = true
			src.Close() // ends the reader
		}
	}
	wg.Wait()
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && !failed && errors.Is(readErr, io.EOF) {
		cw.CloseWrite()
		return
	}
	dst.Close()
	src.Close()
}
