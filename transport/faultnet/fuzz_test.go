package faultnet

import (
	"net"
	"testing"
)

// FuzzParseAddr checks the parsing of the addresses memberlist hands the
// Transport (they come from gossip): no panic, and a parsed address maps to
// the same key whether it arrives as a string or as a net.Addr.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:7946", "[::ffff:127.0.0.1]:1", "[::1]:80", "host:1", ":1", "", "1.2.3.4:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, ok := parseAddr(s)
		if !ok {
			return
		}
		if !key.Addr().Unmap().IsValid() || key.Addr().Is4In6() {
			t.Fatalf("parseAddr(%q) = %v, not canonical", s, key)
		}
		for _, a := range []net.Addr{net.UDPAddrFromAddrPort(key), net.TCPAddrFromAddrPort(key)} {
			if got, ok := netAddrKey(a); !ok || got != key {
				t.Fatalf("netAddrKey(%v) = %v, %v; want %v", a, got, ok, key)
			}
		}
	})
}
