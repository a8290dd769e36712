package faultnet_test

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// A Filter drops packets to and from a blocked peer and refuses dials to
// it; unblocked, the peer is heard again.
func TestFilter(t *testing.T) {
	var block atomic.Pointer[netip.AddrPort]
	none := netip.AddrPort{}
	block.Store(&none)
	bind := func() *faultnet.Filter {
		nt, err := faultnet.Bind("127.0.0.1", 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		f := faultnet.NewFilter(nt, func(p netip.AddrPort) bool { return p == *block.Load() })
		t.Cleanup(func() { _ = f.Shutdown() })
		return f
	}
	a, b := bind(), bind()
	addr := func(f *faultnet.Filter) string {
		ip, port, err := f.FinalAdvertiseAddr("", 0)
		if err != nil {
			t.Fatal(err)
		}
		return netip.AddrPortFrom(netip.MustParseAddr(ip.String()), uint16(port)).String()
	}
	aAddr, bAddr := addr(a), addr(b)
	receive := func(f *faultnet.Filter) (string, bool) {
		select {
		case p := <-f.PacketCh():
			return string(p.Buf), true
		case <-time.After(300 * time.Millisecond): // long enough for loopback
			return "", false
		}
	}
	if _, err := b.WriteToAddress([]byte("hi"), memberlist.Address{Addr: aAddr}); err != nil {
		t.Fatal(err)
	}
	if got, ok := receive(a); !ok || got != "hi" {
		t.Fatalf("unfiltered packet: %q %v", got, ok)
	}
	bap := netip.MustParseAddrPort(bAddr)
	block.Store(&bap) // a blocks b
	_, _ = b.WriteToAddress([]byte("dropped on arrival"), memberlist.Address{Addr: aAddr})
	if got, ok := receive(a); ok {
		t.Fatalf("a received %q from a blocked peer", got)
	}
	_, _ = a.WriteToAddress([]byte("dropped on departure"), memberlist.Address{Addr: bAddr})
	if got, ok := receive(b); ok {
		t.Fatalf("b received %q from a, which blocks it", got)
	}
	if _, err := a.DialTimeout(bAddr, time.Second); !errors.Is(err, faultnet.ErrLinkDown) {
		t.Fatalf("dial to a blocked peer: %v, want ErrLinkDown", err)
	}
	block.Store(&none)
	c, err := a.DialTimeout(bAddr, time.Second)
	if err != nil {
		t.Fatalf("dial after unblocking: %v", err)
	}
	c.Close()
	select { // b's listener hands the stream on; take it, or b can't shut down
	case s := <-b.StreamCh():
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("b did not accept the stream")
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal("second Shutdown:", err)
	}
}
