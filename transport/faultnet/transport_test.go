package faultnet

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
)

// waitTimeout bounds every wait for a packet or a condition in this package.
const waitTimeout = 5 * time.Second

func newTransport(t *testing.T, n *Network, name string) *Transport {
	t.Helper()
	tr, err := n.Transport(name, TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr
}

func send(t *testing.T, from, to *Transport, payload string) {
	t.Helper()
	if _, err := from.WriteTo([]byte(payload), to.Addr()); err != nil {
		t.Fatalf("%s -> %s: %v", from.Name(), to.Name(), err)
	}
}

// recv returns the next packet delivered to tr.
func recv(t *testing.T, tr *Transport) *memberlist.Packet {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	select {
	case p := <-tr.PacketCh():
		return p
	case <-timer.C:
		t.Fatalf("%s received no packet within %v", tr.Name(), waitTimeout)
		return nil
	}
}

func expect(t *testing.T, tr *Transport, payload string) {
	t.Helper()
	if p := recv(t, tr); !bytes.Equal(p.Buf, []byte(payload)) {
		t.Fatalf("%s received %q, want %q", tr.Name(), p.Buf, payload)
	}
}

func TestPacketsPass(t *testing.T) {
	n := New()
	a, b := newTransport(t, n, "a"), newTransport(t, n, "b")
	send(t, a, b, "hello")
	p := recv(t, b)
	if string(p.Buf) != "hello" || p.From.String() != a.Addr() {
		t.Fatalf("got %q from %v, want %q from %s", p.Buf, p.From, "hello", a.Addr())
	}
	if sent, dropped := n.Stats(); sent != 1 || dropped != 0 {
		t.Fatalf("stats = %d sent %d dropped, want 1 0", sent, dropped)
	}
}

func TestCutIsOneWay(t *testing.T) {
	n := New()
	a, b := newTransport(t, n, "a"), newTransport(t, n, "b")
	n.Cut("a", "b")

	send(t, a, b, "lost")
	if _, dropped := n.Stats(); dropped != 1 {
		t.Fatalf("dropped = %d after a cut packet, want 1", dropped)
	}
	send(t, b, a, "b->a")
	expect(t, a, "b->a")

	// Streams need both directions: refused either way.
	for _, d := range []struct{ from, to *Transport }{{a, b}, {b, a}} {
		conn, err := d.from.DialTimeout(d.to.Addr(), time.Second)
		if !errors.Is(err, ErrLinkDown) {
			if conn != nil {
				_ = conn.Close()
			}
			t.Fatalf("dial %s -> %s: err = %v, want ErrLinkDown", d.from.Name(), d.to.Name(), err)
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			t.Fatalf("dial error %v is not a *net.OpError", err)
		}
	}

	// After healing, the next packet a sends is the first b receives: the
	// cut packet never arrived.
	n.Heal()
	send(t, a, b, "after heal")
	expect(t, b, "after heal")
}

func TestDeliverySideCheck(t *testing.T) {
	n := New()
	a, b, c := newTransport(t, n, "a"), newTransport(t, n, "b"), newTransport(t, n, "c")
	if err := n.Delay(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	send(t, a, c, "in flight")
	n.Cut("a", "c") // set while the packet waits at c
	send(t, b, c, "marker")
	// Delayed packets are delivered in arrival order, so the marker coming
	// first proves the in-flight packet was dropped on delivery.
	expect(t, c, "marker")
	if _, dropped := n.Stats(); dropped != 1 {
		t.Fatalf("dropped = %d, want 1", dropped)
	}
}

func TestDelay(t *testing.T) {
	n := New()
	a, b := newTransport(t, n, "a"), newTransport(t, n, "b")
	const d = 150 * time.Millisecond
	if err := n.Delay(d); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	send(t, a, b, "late")
	p := recv(t, b)
	if got := time.Since(start); got < d {
		t.Fatalf("packet delivered after %v, want at least %v", got, d)
	}
	if p.Timestamp.Sub(start) < d {
		t.Fatalf("packet timestamp %v after send, want at least %v", p.Timestamp.Sub(start), d)
	}
	// Packets still waiting when the receiver shuts down are discarded
	// and no goroutine is left behind (checked by TestMain).
	send(t, a, b, "never delivered")
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
}

func TestDropAll(t *testing.T) {
	n := New()
	a, b := newTransport(t, n, "a"), newTransport(t, n, "b")
	if err := n.Drop(1); err != nil {
		t.Fatal(err)
	}
	const packets = 100
	for range packets {
		send(t, a, b, "lost")
		send(t, b, a, "lost")
	}
	if sent, dropped := n.Stats(); sent != 2*packets || dropped != 2*packets {
		t.Fatalf("stats = %d sent %d dropped, want %d %d", sent, dropped, 2*packets, 2*packets)
	}
	// Streams are not affected by Drop.
	conn, err := a.DialTimeout(b.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial under Drop(1): %v", err)
	}
	_ = conn.Close()
	if err := n.Drop(0); err != nil {
		t.Fatal(err)
	}
	send(t, a, b, "first")
	expect(t, b, "first")
}

func TestStreamsPassAndAreAttributed(t *testing.T) {
	n := New()
	a, b := newTransport(t, n, "a"), newTransport(t, n, "b")
	conn, err := a.DialTimeout(b.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	var accepted net.Conn
	select {
	case accepted = <-b.StreamCh():
	case <-timer.C:
		t.Fatal("no stream accepted")
	}
	defer accepted.Close()
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if err := accepted.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := accepted.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read %q, %v", buf, err)
	}
	key, _ := netAddrKey(accepted.RemoteAddr())
	n.mu.Lock()
	dialer := n.dialers[key]
	n.mu.Unlock()
	if dialer != "a" {
		t.Fatalf("stream attributed to %q, want a", dialer)
	}
	if n.acceptStream(accepted.RemoteAddr(), "b") != true {
		t.Fatal("stream refused without faults")
	}
	n.Cut("b", "a")
	if n.acceptStream(accepted.RemoteAddr(), "b") {
		t.Fatal("stream from a accepted at b while b -> a is cut")
	}
}

func TestShutdownVanishes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	n := New()
	a, err := n.Transport("a", TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Transport("b", TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Leave a backlog nobody reads and an open stream: Shutdown must not
	// block on either.
	for range 50 {
		send(t, a, b, "backlog")
	}
	conn, err := a.DialTimeout(b.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
	_ = conn.Close()
	if _, ok := n.Addr("b"); ok {
		t.Error("shut down node still has an address")
	}
	if _, err := b.WriteTo([]byte("x"), a.Addr()); !errors.Is(err, ErrClosed) {
		t.Errorf("write after shutdown: err = %v, want ErrClosed", err)
	}
	if _, err := b.DialTimeout(a.Addr(), time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("dial after shutdown: err = %v, want ErrClosed", err)
	}
	// The node is gone from the wire: dialing its old address fails.
	if c, err := a.DialTimeout(b.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Error("dial to a shut down node succeeded")
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
}

func TestRebindReplacesMapping(t *testing.T) {
	n := New()
	a := newTransport(t, n, "a")
	old := newTransport(t, n, "x")
	oldAddr := old.Addr()
	if err := old.Shutdown(); err != nil {
		t.Fatal(err)
	}
	restarted := newTransport(t, n, "x")
	if got, ok := n.Addr("x"); !ok || got != restarted.Addr() {
		t.Fatalf("Addr(x) = %q, %v; want %q", got, ok, restarted.Addr())
	}
	n.Cut("a", "x")
	send(t, a, restarted, "lost")
	if _, dropped := n.Stats(); dropped != 1 {
		t.Fatalf("packet to the restarted node not dropped by a cut naming it")
	}
	if oldAddr != restarted.Addr() {
		// The old address belongs to nobody now: outside the fault model.
		if _, err := a.WriteTo([]byte("x"), oldAddr); err != nil {
			t.Fatal(err)
		}
		if _, dropped := n.Stats(); dropped != 1 {
			t.Fatalf("packet to a forgotten address counted as dropped")
		}
	}
	n.Heal()
	send(t, a, restarted, "first")
	expect(t, restarted, "first")
}

func TestAdvertiseAddr(t *testing.T) {
	n := New()
	a := newTransport(t, n, "a")
	ip, port, err := a.FinalAdvertiseAddr("", 7946)
	if err != nil || ip.String() != "127.0.0.1" || port != a.Port() {
		t.Fatalf("FinalAdvertiseAddr(\"\") = %v, %d, %v", ip, port, err)
	}
	if _, _, err := a.FinalAdvertiseAddr("127.0.0.1", a.Port()); err != nil {
		t.Fatalf("own address refused: %v", err)
	}
	for _, bad := range []struct {
		ip   string
		port int
	}{{"10.0.0.1", a.Port()}, {"127.0.0.1", a.Port() + 1}, {"not an ip", 1}} {
		if _, _, err := a.FinalAdvertiseAddr(bad.ip, bad.port); !errors.Is(err, ErrInvalid) {
			t.Errorf("FinalAdvertiseAddr(%q, %d): err = %v, want ErrInvalid", bad.ip, bad.port, err)
		}
	}
}
