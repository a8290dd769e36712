package faultctl

import (
	"net/netip"
	"testing"
)

// The peers of POST /debug/cut come from the network: any input is split
// and parsed without a panic, and an accepted address is the one written.
func FuzzCutPeers(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1:7946", "127.0.0.1:1, [::1]:2", " , ,", "::ffff:127.0.0.1:80", "host:1", "127.0.0.1:99999", "[::1]:0,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range splitPeers(s) {
			a, err := parseGossipAddr(p)
			if err != nil {
				continue
			}
			back, err := netip.ParseAddrPort(a.String())
			if err != nil || back != a || a.Addr().Is4In6() {
				t.Fatalf("parseGossipAddr(%q) = %v: does not round-trip (%v, %v)", p, a, back, err)
			}
		}
	})
}
