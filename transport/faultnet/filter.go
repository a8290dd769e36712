package faultnet

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Bind returns memberlist's own NetTransport bound to host:port (UDP and
// TCP). With port 0 the kernel picks the port, and Bind retries when the
// port it picked for TCP is taken for UDP, as memberlist does for the
// transport it builds itself. The transport's errors go to logger at level
// Error (nil discards them).
func Bind(host string, port int, logger *slog.Logger) (*memberlist.NetTransport, error) {
	l := log.New(io.Discard, "", 0)
	if logger != nil {
		l = slog.NewLogLogger(logger.Handler(), slog.LevelError)
	}
	nt, err := bind(host, port, l)
	if err != nil {
		return nil, fmt.Errorf("faultnet: bind %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	return nt, nil
}

// A Filter is a memberlist.NodeAwareTransport around a NetTransport that
// cuts its node off from the peers Blocked names: packets to and from them
// are dropped (a packet to one is reported as sent, as a lost UDP packet
// is) and dials to them fail at once with an error wrapping ErrLinkDown.
// It needs no Network: it is for a node in a process of its own, which
// learns what to cut from elsewhere (a test, a demo's control endpoint),
// where a Network sees every node of one process.
//
// Accepted streams are not filtered: their source port does not tell which
// peer dialed. So cut both ends of a link, as a real partition does.
//
// Set it as memberlist.Config.Transport; memberlist calls Shutdown. All
// methods are safe for concurrent use, and Blocked is called concurrently.
type Filter struct {
	inner   *memberlist.NetTransport
	blocked func(peer netip.AddrPort) bool

	packetCh chan *memberlist.Packet
	stopping chan struct{} // closed by Shutdown: deliver nothing more
	stopped  chan struct{} // closed once the inner listeners have exited
	wg       sync.WaitGroup
	once     sync.Once
	err      error
}

var _ memberlist.NodeAwareTransport = (*Filter)(nil)

// NewFilter wraps inner (from Bind), cutting the peers blocked reports
// true for; blocked gets a peer's gossip address with an IPv4 address
// unmapped. The Filter owns inner from now on.
func NewFilter(inner *memberlist.NetTransport, blocked func(peer netip.AddrPort) bool) *Filter {
	f := &Filter{
		inner:    inner,
		blocked:  blocked,
		packetCh: make(chan *memberlist.Packet),
		stopping: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	f.wg.Add(1)
	go f.pump()
	return f
}

// cut reports whether the peer at addr (ip:port) is blocked.
func (f *Filter) cut(addr string) bool {
	a, ok := parseAddr(addr)
	return ok && f.blocked(a)
}

// FinalAdvertiseAddr implements memberlist.Transport.
func (f *Filter) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return f.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport.
func (f *Filter) WriteTo(b []byte, addr string) (time.Time, error) {
	return f.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (f *Filter) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if f.cut(a.Addr) {
		return time.Now(), nil
	}
	return f.inner.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport.
func (f *Filter) PacketCh() <-chan *memberlist.Packet { return f.packetCh }

// DialTimeout implements memberlist.Transport.
func (f *Filter) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return f.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (f *Filter) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if f.cut(a.Addr) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%w: %s is cut off", ErrLinkDown, a.Addr)}
	}
	return f.inner.DialAddressTimeout(a, timeout)
}

// StreamCh implements memberlist.Transport.
func (f *Filter) StreamCh() <-chan net.Conn { return f.inner.StreamCh() }

// Shutdown implements memberlist.Transport: it closes the sockets and
// returns once the Filter's goroutine has ended. It is idempotent.
func (f *Filter) Shutdown() error {
	f.once.Do(func() {
		close(f.stopping)
		// The pump drains the inner packet channel until the listeners
		// have exited, so they never block on a send.
		f.err = f.inner.Shutdown()
		close(f.stopped)
		f.wg.Wait()
	})
	return f.err
}

// pump passes received packets on, except those from a blocked peer.
func (f *Filter) pump() {
	defer f.wg.Done()
	for {
		select {
		case p := <-f.inner.PacketCh():
			if a, ok := netAddrKey(p.From); ok && f.blocked(a) {
				continue
			}
			select {
			case f.packetCh <- p:
			case <-f.stopping:
			}
		case <-f.stopped:
			return
		}
	}
}
