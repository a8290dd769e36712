package faultnet

import (
	"io"
	"log"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// BenchmarkPacketRoundTrip sends one packet and waits for its delivery,
// through a faultnet Transport and, beside it, through memberlist's plain
// NetTransport, to show the cost of the fault layer.
func BenchmarkPacketRoundTrip(b *testing.B) {
	payload := make([]byte, 512)
	run := func(b *testing.B, from memberlist.Transport, to memberlist.Transport, addr string) {
		timer := time.NewTimer(waitTimeout)
		defer timer.Stop()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := from.WriteTo(payload, addr); err != nil {
				b.Fatal(err)
			}
			select {
			case <-to.PacketCh():
			case <-timer.C:
				b.Fatal("packet lost on loopback")
			}
		}
	}
	b.Run("faultnet", func(b *testing.B) {
		n := New()
		from, err := n.Transport("a", TransportConfig{})
		if err != nil {
			b.Fatal(err)
		}
		defer from.Shutdown()
		to, err := n.Transport("b", TransportConfig{})
		if err != nil {
			b.Fatal(err)
		}
		defer to.Shutdown()
		run(b, from, to, to.Addr())
	})
	b.Run("nettransport", func(b *testing.B) {
		newNT := func() *memberlist.NetTransport {
			nt, err := bind(loopback, 0, log.New(io.Discard, "", 0))
			if err != nil {
				b.Fatal(err)
			}
			return nt
		}
		from, to := newNT(), newNT()
		defer from.Shutdown()
		defer to.Shutdown()
		addr := netip.AddrPortFrom(netip.MustParseAddr(loopback), uint16(to.GetAutoBindPort()))
		run(b, from, to, addr.String())
	})
}
