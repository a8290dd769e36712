package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
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

// A goodbye heard over a stream (sayGoodbye) carries the leaver's own
// metadata: it must say Gone and, with token keys set, verify for the name
// it carries; it counts only for the life (incarnation) it names, and it
// holds for the rest of that life, whatever older metadata is heard later.
func TestGoodbyeCountsForTheLifeItNames(t *testing.T) {
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	other := metaKeys(t, "another cluster's token key....")
	gone := meta{Cluster: "tenure", Incarnation: 5, Leaving: true, Gone: true}
	bye := func(name string, m meta, k *ownership.Keyring) []byte {
		b, err := m.encode(name, k)
		if err != nil {
			t.Fatal(err)
		}
		return encodeGoodbye(name, b)
	}
	if name, got, err := decodeGoodbye(bye("x", gone, keys), keys); err != nil || name != "x" || got != gone {
		t.Fatalf("decodeGoodbye(encodeGoodbye) = %q, %+v, %v", name, got, err)
	}
	leaving := gone
	leaving.Gone = false
	for what, b := range map[string][]byte{
		"signed under another key": bye("x", gone, other),
		"unsigned":                 bye("x", gone, nil),
		"another node's metadata":  encodeGoodbye("y", bye("x", gone, keys)[3:]),
		"metadata not saying gone": bye("x", leaving, keys),
		"no name":                  {goodbyeMagic, 0},
		"a name past the bytes":    {goodbyeMagic, 9, 'x'},
		"gossip's magic":           append([]byte{0x67}, bye("x", gone, keys)[1:]...),
		"empty":                    nil,
	} {
		if _, _, err := decodeGoodbye(b, keys); !errors.Is(err, errBadMeta) {
			t.Errorf("goodbye %s: %v, want errBadMeta", what, err)
		}
	}

	node := func(m meta) *memberlist.Node {
		b, err := m.encode("x", nil)
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: "x", Meta: b}
	}
	var s nodeSet
	s.put(node(leaving), nil)
	if s.heardGoodbye("x", 6) || s.heardGoodbye("y", 5) {
		t.Fatal("a goodbye of another life, or of no member, was taken")
	}
	s.del("x")
	if _, left := s.snapshot(); len(left) != 0 {
		t.Fatalf("left %v after a drop with no goodbye of its life, want none", left)
	}
	s.put(node(leaving), nil)
	if !s.heardGoodbye("x", 5) {
		t.Fatal("the goodbye of the member's own life was refused")
	}
	s.put(node(leaving), nil) // older metadata, heard late
	s.del("x")
	if _, left := s.snapshot(); !slices.Equal(left, []string{"x"}) {
		t.Fatalf("left %v after a drop with its goodbye heard, want [x]", left)
	}
	next := leaving
	next.Incarnation = 6
	s.put(node(leaving), nil)
	s.heardGoodbye("x", 5)
	s.put(node(next), nil) // a new life under the same name
	s.del("x")
	if _, left := s.snapshot(); len(left) != 0 {
		t.Fatalf("left %v: a new life inherited the old one's goodbye", left)
	}
}

// The delegate takes a goodbye only from a member of this cluster, and
// only the goodbye of the member's current life.
func TestDelegateTakesOnlyThisClustersGoodbye(t *testing.T) {
	f, err := ownership.NewMemoryFence(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("gb-self")
	cfg.Handler = &gatedHandler{}
	cfg.Fence = f
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := &delegate{c: c}
	enc := func(m meta) []byte {
		b, err := m.encode("gb-peer", nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	alive := meta{Cluster: c.cfg.ClusterName, RingVersion: ring.AlgorithmVersion, Incarnation: 9}
	d.NotifyJoin(&memberlist.Node{Name: "gb-peer", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: enc(alive)})
	gone := func() bool {
		c.nodes.mu.Lock()
		defer c.nodes.mu.Unlock()
		return c.nodes.nodes["gb-peer"].meta.Gone
	}
	other := alive
	other.Cluster, other.Gone = "another cluster", true
	d.NotifyMsg(encodeGoodbye("gb-peer", enc(other)))
	if gone() {
		t.Fatal("a goodbye naming another cluster was taken")
	}
	mine := alive
	mine.Gone = true
	d.NotifyMsg(encodeGoodbye("gb-peer", enc(mine)))
	if !gone() {
		t.Fatal("the member's own goodbye was not taken")
	}
}

// Every node's metadata shows, in the end, the stable membership it holds
// (ActShow): the members that see it learn from it whether their own is
// outdated. A cluster's start is a burst of changes, shown as its latest
// within ShowTicks.
func TestMetadataShowsTheStableMembership(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "show", 3)
	nodes := tc.all()
	err := testkit.Check(ctx, func() error {
		for _, n := range nodes {
			held := n.c.stable.Load().ID()
			for _, o := range nodes {
				if o == n {
					continue
				}
				seen := false
				for _, e := range o.c.nodes.live() {
					if e.member.Name != n.name {
						continue
					}
					seen = true
					if e.err != nil || e.meta.Stable != held {
						return fmt.Errorf("%s sees %s's metadata show stable %v (%v), %s holds %v", o.name, n.name, e.meta.Stable, e.err, n.name, held)
					}
				}
				if !seen {
					return fmt.Errorf("%s does not see %s", o.name, n.name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
