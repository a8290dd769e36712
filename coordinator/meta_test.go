package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []meta{
		{},
		{Cluster: "c", RingVersion: "v1", Incarnation: 1<<64 - 1, ServiceAddr: "127.0.0.1:9000"},
		{Cluster: "c", Stable: ownership.StableID{Version: 3, Hash: 1<<64 - 1}, Leaving: true},
	} {
		b, err := m.encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeMeta(b)
		if err != nil || got != m {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}
	if _, err := (meta{ServiceAddr: strings.Repeat("x", 600)}).encode(); err == nil {
		t.Fatal("oversized metadata encoded")
	}
	for _, b := range [][]byte{nil, {3}, {1, 0, 0, 0, 0}, {2}, {2, 2, 0, 0, 0, 0, 0, 0}, {2, 0, 0, 0, 0, 5, 'a'}, {2, 0, 0, 0, 0, 0, 0, 0, 9}} {
		if _, err := decodeMeta(b); !errors.Is(err, errBadMeta) {
			t.Fatalf("decodeMeta(%v) = %v, want errBadMeta", b, err)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	good, _ := meta{Cluster: "tenure", RingVersion: "v", Incarnation: 7, ServiceAddr: "a:1"}.encode()
	f.Add(good)
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		again, err := m.encode()
		if err != nil {
			t.Fatalf("decoded metadata does not re-encode: %v", err)
		}
		if m2, err := decodeMeta(again); err != nil || m2 != m {
			t.Fatalf("round trip: %+v != %+v (%v)", m2, m, err)
		}
	})
}
