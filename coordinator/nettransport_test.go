package coordinator

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/internal/testkit"
)

func newTestNetTransport(t testing.TB) *netTransport {
	t.Helper()
	nt, err := listenNetTransport("127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nt.Shutdown() })
	return nt
}

func (t *netTransport) addr() string { return fmt.Sprintf("127.0.0.1:%d", t.port()) }

func recvPacket(t *testing.T, nt *netTransport) *memberlist.Packet {
	t.Helper()
	select {
	case p := <-nt.PacketCh():
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no packet in 10 s")
		return nil
	}
}

// TestNetTransportGivesEachPacketItsOwnBuffer: a packet keeps its bytes
// after the next arrives (the listener reuses one buffer to read into),
// in a buffer of its own size, not the 64 KiB memberlist's NetTransport
// allocates per packet; and it names its sender.
func TestNetTransportGivesEachPacketItsOwnBuffer(t *testing.T) {
	a, b := newTestNetTransport(t), newTestNetTransport(t)
	first := []byte("the first packet")
	if _, err := a.WriteToAddress(first, memberlist.Address{Addr: b.addr(), Name: "b"}); err != nil {
		t.Fatal(err)
	}
	p1 := recvPacket(t, b)
	second := bytes.Repeat([]byte{'x'}, 1200)
	if _, err := a.WriteTo(second, b.addr()); err != nil {
		t.Fatal(err)
	}
	p2 := recvPacket(t, b)
	if !bytes.Equal(p1.Buf, first) {
		t.Errorf("first packet reads %q after the second arrived, want %q", p1.Buf, first)
	}
	if !bytes.Equal(p2.Buf, second) {
		t.Errorf("second packet: %d bytes, want %d", len(p2.Buf), len(second))
	}
	if c := cap(p2.Buf); c > 2*len(second) {
		t.Errorf("a %d-byte packet came in a buffer of %d bytes", len(second), c)
	}
	if got := p1.From.String(); got != a.addr() {
		t.Errorf("packet from %s, want %s", got, a.addr())
	}
	if p1.Timestamp.IsZero() {
		t.Error("packet has no receive time")
	}
}

// TestNetTransportResolvesNames: an address by host name is resolved, as
// memberlist's NetTransport does; a bad one is an error.
func TestNetTransportResolvesNames(t *testing.T) {
	a, b := newTestNetTransport(t), newTestNetTransport(t)
	if _, err := a.WriteTo([]byte("hi"), fmt.Sprintf("localhost:%d", b.port())); err != nil {
		t.Fatal(err)
	}
	if p := recvPacket(t, b); string(p.Buf) != "hi" {
		t.Fatalf("got %q", p.Buf)
	}
	if _, err := a.WriteTo([]byte("hi"), "no port"); err == nil {
		t.Error("a write to an address without a port succeeded")
	}
}

// TestNetTransportPortAndAddress: TCP and UDP share the port, and the
// advertised address is the given one, or else the bound one.
func TestNetTransportPortAndAddress(t *testing.T) {
	nt := newTestNetTransport(t)
	if u := nt.udp.LocalAddr().(*net.UDPAddr).Port; u != nt.port() {
		t.Errorf("UDP on port %d, TCP on %d", u, nt.port())
	}
	ip, port, err := nt.FinalAdvertiseAddr("", 0)
	if err != nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) || port != nt.port() {
		t.Errorf("FinalAdvertiseAddr(\"\", 0) = %v, %d, %v; want 127.0.0.1, %d", ip, port, err, nt.port())
	}
	ip, port, err = nt.FinalAdvertiseAddr("10.1.2.3", 7946)
	if err != nil || ip.String() != "10.1.2.3" || len(ip) != net.IPv4len || port != 7946 {
		t.Errorf("FinalAdvertiseAddr(10.1.2.3, 7946) = %v, %d, %v", ip, port, err)
	}
	if _, _, err := nt.FinalAdvertiseAddr("not an ip", 1); err == nil {
		t.Error("a bad advertise address was taken")
	}
	if _, err := newNetTransport("localhost", 0, nil); err == nil {
		t.Error("a bind address that is not an IP was taken")
	}
	if _, err := newNetTransport("127.0.0.1", nt.port(), nil); err == nil {
		t.Error("bound a port already taken")
	}
}

// TestNetTransportAdvertisesAPrivateAddressWhenUnbound: bound to 0.0.0.0
// or ::, the transport advertises a private address of the host (as
// NetTransport does for 0.0.0.0), or fails when the host has none.
func TestNetTransportAdvertisesAPrivateAddressWhenUnbound(t *testing.T) {
	private, err := sockaddr.GetPrivateIP()
	if err != nil {
		t.Fatal(err)
	}
	for _, bind := range []string{"0.0.0.0", "::"} {
		nt, err := newNetTransport(bind, 0, nil)
		if err != nil {
			t.Fatalf("bind %s: %v", bind, err)
		}
		ip, port, err := nt.FinalAdvertiseAddr("", 0)
		nt.Shutdown()
		switch {
		case private == "" && err == nil:
			t.Errorf("bound to %s on a host without a private address: advertised %v", bind, ip)
		case private != "" && (err != nil || ip.String() != private || port != nt.port()):
			t.Errorf("bound to %s: advertised %v:%d (%v), want %s:%d", bind, ip, port, err, private, nt.port())
		}
	}
}

// lineCounter is a log writer that counts the lines holding a phrase.
type lineCounter struct {
	phrase string
	n      atomic.Int64
}

func (w *lineCounter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.phrase)) {
		w.n.Add(1)
	}
	return len(p), nil
}

// TestNetTransportBacksOffAndRecovers: a listener whose reads or accepts
// fail (here: a deadline in the past) backs off between failures rather
// than spinning, and serves again once they succeed.
func TestNetTransportBacksOffAndRecovers(t *testing.T) {
	for _, tc := range []struct {
		phrase string
		fail   func(nt *netTransport, until time.Time)
		works  func(t *testing.T, a, b *netTransport)
	}{
		{"reading a gossip packet", func(nt *netTransport, until time.Time) { _ = nt.udp.SetReadDeadline(until) },
			func(t *testing.T, a, b *netTransport) {
				if _, err := a.WriteTo([]byte("again"), b.addr()); err != nil {
					t.Fatal(err)
				}
				if p := recvPacket(t, b); string(p.Buf) != "again" {
					t.Fatalf("got %q", p.Buf)
				}
			}},
		{"accepting a gossip stream", func(nt *netTransport, until time.Time) { _ = nt.tcp.SetDeadline(until) },
			func(t *testing.T, a, b *netTransport) {
				c, err := a.DialTimeout(b.addr(), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				select {
				case in := <-b.StreamCh():
					in.Close()
				case <-time.After(10 * time.Second):
					t.Fatal("no stream in 10 s")
				}
			}},
	} {
		t.Run(tc.phrase, func(t *testing.T) {
			w := &lineCounter{phrase: tc.phrase}
			a := newTestNetTransport(t)
			b, err := newNetTransport("127.0.0.1", 0, log.New(w, "", 0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Shutdown() })
			tc.fail(b, time.Unix(1, 0))
			ctx := testkit.Ctx(t, 10*time.Second)
			testkit.WaitFor(ctx, t, "three failures", func() bool { return w.n.Load() >= 3 })
			// Backing off from 5 ms, three failures take 35 ms; without
			// a backoff they come by the thousand in that time.
			if n := w.n.Load(); n > 50 {
				t.Errorf("%d failures logged by the time three were seen: no backoff", n)
			}
			tc.fail(b, time.Time{})
			tc.works(t, a, b)
		})
	}
}

// TestNetTransportStreams: a dialed stream arrives at the other end.
func TestNetTransportStreams(t *testing.T) {
	a, b := newTestNetTransport(t), newTestNetTransport(t)
	c, err := a.DialAddressTimeout(memberlist.Address{Addr: b.addr()}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("push")); err != nil {
		t.Fatal(err)
	}
	var in net.Conn
	select {
	case in = <-b.StreamCh():
	case <-time.After(10 * time.Second):
		t.Fatal("no stream in 10 s")
	}
	defer in.Close()
	got := make([]byte, 4)
	_ = in.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(in, got); err != nil || string(got) != "push" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestNetTransportShutdownDoesNotWaitForReaders: Shutdown returns though
// a packet and a stream wait for a reader that never comes (memberlist
// stops reading after the transport's Shutdown returns), and again when
// called twice.
func TestNetTransportShutdownDoesNotWaitForReaders(t *testing.T) {
	a := newTestNetTransport(t)
	b, err := newNetTransport("127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Not waited for: a Shutdown that hangs is what this test looks for,
	// and must fail it, not hang it.
	t.Cleanup(func() { go b.Shutdown() })
	if _, err := a.WriteTo([]byte("unread"), b.addr()); err != nil {
		t.Fatal(err)
	}
	c, err := a.DialTimeout(b.addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Both listeners have taken what came, and wait to hand it over.
	ctx := testkit.Ctx(t, 10*time.Second)
	testkit.WaitFor(ctx, t, "the listeners to block on a handover", func() bool {
		return handingOver("readPackets") && handingOver("acceptStreams")
	})
	done := make(chan struct{})
	go func() {
		b.Shutdown()
		b.Shutdown()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still waiting after 10 s")
	}
}

// handingOver reports whether netTransport's fn is blocked on a channel
// (handing something over), not reading its socket.
func handingOver(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, "netTransport)."+fn) && (strings.Contains(head, "[select") || strings.Contains(head, "[chan send")) {
			return true
		}
	}
	return false
}

// BenchmarkTransportReceive: what a received packet of 1 KB costs in
// memory, ours against memberlist's NetTransport.
func BenchmarkTransportReceive(b *testing.B) {
	pkt := bytes.Repeat([]byte{'p'}, 1024)
	for _, tc := range []struct {
		name string
		bind func() (memberlist.Transport, int, error)
	}{
		{"ours", func() (memberlist.Transport, int, error) {
			nt := newTestNetTransport(b)
			return nt, nt.port(), nil
		}},
		{"memberlist", func() (memberlist.Transport, int, error) {
			nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: nil})
			if err != nil {
				return nil, 0, err
			}
			b.Cleanup(func() { nt.Shutdown() })
			return nt, nt.GetAutoBindPort(), nil
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tr, port, err := tc.bind()
			if err != nil {
				b.Fatal(err)
			}
			out, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
			if err != nil {
				b.Fatal(err)
			}
			defer out.Close()
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				if _, err := out.Write(pkt); err != nil {
					b.Fatal(err)
				}
				select {
				case <-tr.PacketCh():
				case <-time.After(10 * time.Second):
					b.Fatal("packet lost on loopback")
				}
			}
		})
	}
}
