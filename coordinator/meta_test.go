package coordinator

import (
	"errors"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
)

func metaKeys(t testing.TB, key string) *ownership.Keyring {
	t.Helper()
	k, err := ownership.NewKeyring(ownership.Key(key))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestMetaRoundTrip(t *testing.T) {
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	for _, m := range []meta{
		{},
		{Cluster: "c", RingVersion: "v1", Incarnation: 1<<64 - 1, ServiceAddr: "127.0.0.1:9000"},
		{Cluster: "c", Stable: quorum.StableID{Version: 3, Hash: 1<<64 - 1}, Leaving: true},
		{Cluster: "c", Leaving: true, Gone: true},
	} {
		for _, k := range []*ownership.Keyring{nil, keys} {
			b, err := m.encode("n1", k)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeMeta(b, "n1", k)
			if err != nil || got != m {
				t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
			}
		}
	}
	if _, err := (meta{ServiceAddr: strings.Repeat("x", 600)}).encode("n1", nil); err == nil {
		t.Fatal("oversized metadata encoded")
	}
	for _, b := range [][]byte{nil, {2}, {1, 0, 0, 0, 0}, {3}, {3, 8, 0, 0, 0, 0, 0, 0}, {3, 0, 0, 0, 0, 5, 'a'}, {3, 0, 0, 0, 0, 0, 0, 0, 9}, {3, 2, 0, 0, 0, 0, 0, 0}} {
		if _, err := decodeMeta(b, "n1", nil); !errors.Is(err, errBadMeta) {
			t.Fatalf("decodeMeta(%v) = %v, want errBadMeta", b, err)
		}
	}
}

// Issue 11, defect 2: with token keys set, node metadata must carry a MAC
// under them for the node's own name: unsigned metadata, metadata signed
// under another key, another node's metadata, and a tampered byte are all
// refused, with an error wrapping ownership.ErrBadMAC.
func TestMetaAuthentication(t *testing.T) {
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	other := metaKeys(t, "another cluster's token key....")
	m := meta{Cluster: "tenure", RingVersion: "v", Incarnation: 7, Stable: quorum.StableID{Version: 1<<64 - 1, Hash: 1}}
	enc := func(name string, k *ownership.Keyring) []byte {
		b, err := m.encode(name, k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tampered := enc("n1", keys)
	tampered[3] ^= 1
	for what, b := range map[string][]byte{
		"unsigned":           enc("n1", nil),
		"under another key":  enc("n1", other),
		"another node's":     enc("n2", keys),
		"tampered":           tampered,
		"with its MAC cut":   enc("n1", keys)[:len(enc("n1", keys))-ownership.MACSize],
		"only a MAC's worth": append([]byte{metaVersion, metaMAC}, make([]byte, ownership.MACSize-1)...),
	} {
		_, err := decodeMeta(b, "n1", keys)
		if !errors.Is(err, errBadMeta) {
			t.Errorf("%s metadata: %v, want errBadMeta", what, err)
		}
	}
	for what, b := range map[string][]byte{"unsigned": enc("n1", nil), "under another key": enc("n1", other), "another node's": enc("n2", keys)} {
		if _, err := decodeMeta(b, "n1", keys); !errors.Is(err, ownership.ErrBadMAC) {
			t.Errorf("%s metadata: %v, want ErrBadMAC", what, err)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	keys := metaKeys(f, "tenure test token key, 32 bytes")
	m := meta{Cluster: "tenure", RingVersion: "v", Incarnation: 7, ServiceAddr: "a:1"}
	good, _ := m.encode("n1", nil)
	signed, _ := m.encode("n1", keys)
	f.Add(good)
	f.Add(signed)
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{3, 2, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{3, 5, 0, 0, 0, 0, 0, 0}) // leaving and gone
	f.Add([]byte{3, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range []*ownership.Keyring{nil, keys} {
			m, err := decodeMeta(b, "n1", k)
			if err != nil {
				continue
			}
			again, err := m.encode("n1", k)
			if err != nil {
				t.Fatalf("decoded metadata does not re-encode: %v", err)
			}
			if m2, err := decodeMeta(again, "n1", k); err != nil || m2 != m {
				t.Fatalf("round trip: %+v != %+v (%v)", m2, m, err)
			}
			if k != nil {
				if _, err := decodeMeta(b, "n2", k); err == nil {
					t.Fatal("signed metadata decoded under another node's name")
				}
			}
		}
	})
}
