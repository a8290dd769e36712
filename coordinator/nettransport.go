package coordinator

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// maxPacket is the largest UDP payload there is. A packet is read into a
// buffer this size, which the listener reuses.
const maxPacket = 65536

// udpRecvBuf is the socket receive buffer asked for, halved until the
// system grants it (as memberlist's NetTransport does).
const udpRecvBuf = 2 << 20

// netTransport is memberlist's NetTransport for one bind address, TCP and
// UDP on one port, with these changes:
//   - A packet is read into the listener's one buffer and handed on in a
//     copy of its own size. NetTransport hands each packet on in a fresh
//     64 KiB buffer: at 100 nodes in one process that was a tenth of the
//     CPU, in zeroing and collecting them.
//   - A packet to an address written as ip:port is sent without resolving
//     it again.
//   - Bound to :: (as to 0.0.0.0), it advertises a private address of the
//     host; NetTransport advertised ::, which no peer can reach.
//   - A failing read backs off as a failing accept does (5 ms, doubling
//     to 1 s), instead of retrying at once.
//   - It reports no go-metrics (NetTransport counts memberlist.udp.received
//     to the global sink); the coordinator counts its own traffic.
//
// Everything else follows NetTransport: the advertised address, the
// receive buffer, and Shutdown returning once its listeners have stopped.
// The fault-injecting transport of the cluster tests (transport/faultnet)
// still wraps NetTransport.
type netTransport struct {
	tcp    *net.TCPListener
	udp    *net.UDPConn
	logger *log.Logger

	packets chan *memberlist.Packet
	streams chan net.Conn

	done     chan struct{} // closed at Shutdown
	stopOnce sync.Once
	wg       sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*netTransport)(nil)

// newNetTransport listens on addr:port, TCP and UDP. Port 0 takes a free
// TCP port, and fails if UDP's is taken (the caller tries again).
func newNetTransport(addr string, port int, logger *log.Logger) (*netTransport, error) {
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	ip := net.ParseIP(addr)
	if ip == nil {
		return nil, fmt.Errorf("bind address %q is not an IP address", addr)
	}
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, fmt.Errorf("TCP listener on %q port %d: %w", addr, port, err)
	}
	if port == 0 {
		port = tcp.Addr().(*net.TCPAddr).Port
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("UDP listener on %q port %d: %w", addr, port, err)
	}
	for size := udpRecvBuf; ; size /= 2 {
		if err = udp.SetReadBuffer(size); err == nil {
			break
		}
		if size <= 1 {
			tcp.Close()
			udp.Close()
			return nil, fmt.Errorf("UDP receive buffer: %w", err)
		}
	}
	t := &netTransport{
		tcp:     tcp,
		udp:     udp,
		logger:  logger,
		packets: make(chan *memberlist.Packet),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}
	t.wg.Add(2)
	go t.acceptStreams()
	go t.readPackets()
	return t, nil
}

// listenNetTransport is newNetTransport, trying again a few times when
// port is 0 and the free TCP port it took is taken for UDP (as memberlist
// does).
func listenNetTransport(addr string, port int, logger *log.Logger) (*netTransport, error) {
	for range 9 {
		nt, err := newNetTransport(addr, port, logger)
		if err == nil || port != 0 || !errors.Is(err, syscall.EADDRINUSE) {
			return nt, err
		}
	}
	return newNetTransport(addr, port, logger)
}

// port is the port both listeners are bound to.
func (t *netTransport) port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr implements memberlist.Transport, as NetTransport
// does: the given address, or else the bound one, or a private address
// of this host when bound to 0.0.0.0 or ::.
func (t *netTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("failed to parse advertise address %q", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	a := t.tcp.Addr().(*net.TCPAddr).IP
	if a.IsUnspecified() {
		private, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("failed to get interface addresses: %w", err)
		}
		if private == "" {
			return nil, 0, errors.New("no private IP address found, and explicit IP not provided")
		}
		if a = net.ParseIP(private); a == nil {
			return nil, 0, fmt.Errorf("failed to parse advertise address %q", private)
		}
	}
	return a, t.port(), nil
}

// WriteTo implements memberlist.Transport.
func (t *netTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (t *netTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if ap, err := netip.ParseAddrPort(a.Addr); err == nil {
		_, err = t.udp.WriteToUDPAddrPort(b, ap)
		return time.Now(), err
	}
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

// PacketCh implements memberlist.Transport.
func (t *netTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout implements memberlist.Transport.
func (t *netTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *netTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

// StreamCh implements memberlist.Transport.
func (t *netTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown implements memberlist.Transport: it closes both listeners and
// returns once their goroutines have ended. A packet or stream not yet
// taken is dropped.
func (t *netTransport) Shutdown() error {
	t.stopOnce.Do(func() {
		close(t.done)
		t.tcp.Close()
		t.udp.Close()
	})
	t.wg.Wait()
	return nil
}

func (t *netTransport) stopping() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// backoff waits after a failed accept or read: 5 ms after the first,
// doubling to 1 s, for *delay, which it updates. It reports false when
// Shutdown began meanwhile.
func (t *netTransport) backoff(delay *time.Duration) bool {
	const minDelay, maxDelay = 5 * time.Millisecond, time.Second
	*delay = min(max(2**delay, minDelay), maxDelay)
	timer := time.NewTimer(*delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.done:
		return false
	}
}

// acceptStreams hands accepted connections to memberlist, backing off
// while accepting fails (out of file descriptors, say).
func (t *netTransport) acceptStreams() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.stopping() {
				return
			}
			t.logger.Printf("[ERR] coordinator: accepting a gossip stream: %v", err)
			if !t.backoff(&delay) {
				return
			}
			continue
		}
		delay = 0
		select {
		case t.streams <- c:
		case <-t.done:
			c.Close()
			return
		}
	}
}

// readPackets hands received packets to memberlist, each in a buffer of
// its own size, backing off while reading fails.
func (t *netTransport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	var delay time.Duration
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		now := time.Now()
		if err != nil {
			if t.stopping() {
				return
			}
			t.logger.Printf("[ERR] coordinator: reading a gossip packet: %v", err)
			if !t.backoff(&delay) {
				return
			}
			continue
		}
		delay = 0
		if n < 1 {
			t.logger.Printf("[ERR] coordinator: empty gossip packet from %v", from)
			continue
		}
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: net.UDPAddrFromAddrPort(from), Timestamp: now}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}
