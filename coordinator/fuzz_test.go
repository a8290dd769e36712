package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
)

// The fuzzers below feed every delegate entry point memberlist calls with
// bytes from the network (NotifyMsg, MergeRemoteState, and the node
// metadata read by NotifyJoin, NotifyUpdate, NotifyAlive, NotifyMerge and
// NotifyLeave) to started coordinators, one without token keys and one
// with. No input may panic a node (memberlist's goroutines recover
// nothing) or stall its loop.

const fuzzKey = "tenure test token key, 32 bytes"

// fuzzNodes starts a coordinator without token keys and one with them,
// each alone in its cluster, closed when tb ends.
func fuzzNodes(tb testing.TB) (plain, keyed *Coordinator) {
	tb.Helper()
	start := func(name string, keys *ownership.Keyring) *Coordinator {
		f, err := ownership.NewMemoryFence(testPartitions)
		if err != nil {
			tb.Fatal(err)
		}
		cfg := testConfig(name)
		cfg.Handler = &gatedHandler{}
		cfg.Fence = f
		cfg.TokenKeys = keys
		c, err := New(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		ctx, cancel := slowtest.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			tb.Fatal(err)
		}
		return c
	}
	return start("fz-plain", nil), start("fz-keyed", metaKeys(tb, fuzzKey))
}

// loopAlive fails t unless c's loop takes in and finishes what its
// delegate handed it: a marker pushed after the input is drained only once
// the loop has processed the batch before it.
func loopAlive(t *testing.T, c *Coordinator) {
	t.Helper()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		c.inbox.push(heard{})
		testkit.WaitFor(ctx, t, c.cfg.Name+"'s loop to take in its gossip", func() bool {
			c.inbox.mu.Lock()
			defer c.inbox.mu.Unlock()
			return len(c.inbox.items) == 0
		})
	}
}

// feedAll hands b to every entry point of c's delegate that reads bytes
// from the network. Each returns within bound.
func feedAll(t *testing.T, c *Coordinator, b []byte, join bool) {
	t.Helper()
	d := &delegate{c: c}
	done := make(chan any, 1)
	go func() {
		// memberlist recovers nothing: a panic here is a dead process.
		defer func() { done <- recover() }()
		d.NotifyMsg(b)
		d.MergeRemoteState(b, join)
		n := &memberlist.Node{Name: "fz-peer", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: b}
		_ = d.NotifyAlive(n)
		_ = d.NotifyMerge([]*memberlist.Node{n, {Name: "fz-other", Meta: b}})
		d.NotifyJoin(n)
		d.NotifyUpdate(n)
		d.NotifyLeave(n)
		// Once more with fz-peer a member, so a goodbye in b can be taken.
		if md, err := (meta{Cluster: c.cfg.ClusterName, RingVersion: ring.AlgorithmVersion, Incarnation: 7}).encode("fz-peer", c.cfg.TokenKeys); err == nil {
			peer := &memberlist.Node{Name: "fz-peer", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: md}
			d.NotifyJoin(peer)
			d.NotifyMsg(b)
			d.NotifyLeave(peer)
		}
	}()
	select {
	case p := <-done:
		if p != nil {
			t.Fatalf("a delegate entry point of %s panicked on %x: %v", c.cfg.Name, b, p)
		}
	case <-time.After(bound):
		t.Fatalf("a delegate entry point of %s did not return within %v", c.cfg.Name, bound)
	}
}

// FuzzDelegateBytes: arbitrary bytes, as gossip and as metadata.
func FuzzDelegateBytes(f *testing.F) {
	keys := metaKeys(f, fuzzKey)
	reg, err := gossip.NewRegister(testPartitions)
	if err != nil {
		f.Fatal(err)
	}
	reg.ObserveClaim(gossip.Claim{Token: keys.Sign(ownership.Token{Partition: 1, Epoch: 2, Owner: "x", Incarnation: 3})})
	for _, k := range []*ownership.Keyring{nil, keys} {
		for _, m := range []gossip.Message{
			{Kind: gossip.KindClaim, Claim: gossip.Claim{Token: k.Sign(ownership.Token{Partition: 1, Epoch: 9, Owner: "x", Incarnation: 3})}},
			{Kind: gossip.KindStable, Stable: quorum.NewStable(4, []string{"a", "b"})},
			{Kind: gossip.KindState, Stable: quorum.NewStable(4, []string{"a", "b"}), Register: reg},
			{Kind: gossip.KindDigest, Stable: quorum.NewStable(4, []string{"a", "b"}), Digest: reg.Digest()},
			{Kind: gossip.KindSection, Section: reg.Sections([]int{0, 1, 2}, 10)[0]},
			{Kind: gossip.KindSection, Section: gossip.Section{Partitions: testPartitions, Ranges: []int{1}}},
		} {
			m.Cluster, m.Sender = "tenure", "x"
			b, err := m.Seal(k)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, false)
			f.Add(b, true)
		}
		md, err := meta{Cluster: "tenure", RingVersion: ring.AlgorithmVersion, Incarnation: 7, ServiceAddr: "a:1"}.encode("fz-peer", k)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(md, true)
		gone, err := meta{Cluster: "tenure", RingVersion: ring.AlgorithmVersion, Incarnation: 7, Gone: true}.encode("fz-peer", k)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(encodeGoodbye("fz-peer", gone), false)
	}
	f.Add([]byte{}, false)
	f.Add([]byte{0x67, 2, 1, 0, 6, 't', 'e', 'n', 'u', 'r', 'e', 1, 'x'}, false)
	plain, keyed := fuzzNodes(f)
	f.Fuzz(func(t *testing.T, b []byte, join bool) {
		for _, c := range []*Coordinator{plain, keyed} {
			feedAll(t, c, b, join)
			loopAlive(t, c)
		}
	})
}

// FuzzDelegateSigned: validly sealed messages of every kind, and valid
// metadata, built from fuzzed fields, unsigned, signed with the cluster's
// key and with another, to both coordinators. Each entry point takes only
// its own kinds: a state as a broadcast or a claim or stable membership as
// push/pull state is dropped, and so is anything sealed under a key the
// keyed node does not hold.
func FuzzDelegateSigned(f *testing.F) {
	f.Add(uint8(0), uint32(3), uint64(9), "fz-plain", uint64(1), false, uint64(4), "a,b", uint8(1), true, "")
	f.Add(uint8(1), uint32(0), uint64(0), "x", uint64(0), true, uint64(1<<20), "a,b,c", uint8(0), false, "ghost")
	f.Add(uint8(2), uint32(31), uint64(1<<40), "fz-keyed", uint64(5), true, uint64(0), "", uint8(2), true, "")
	f.Add(uint8(2), uint32(7), uint64(3), "y", uint64(2), false, uint64(2), "fz-keyed,y", uint8(1), false, "svc:1")
	f.Add(uint8(3), uint32(7), uint64(3), "y", uint64(2), false, uint64(2), "fz-keyed,y", uint8(1), false, "svc:1")
	f.Add(uint8(4), uint32(7), uint64(3), "y", uint64(2), true, uint64(2), "fz-keyed,y", uint8(1), false, "svc:1")
	f.Add(uint8(4), uint32(9), uint64(3), "y", uint64(2), true, uint64(2), "fz-keyed,y", uint8(2), false, "svc:1")
	keys := metaKeys(f, fuzzKey)
	other := metaKeys(f, "another cluster's token key....")
	plain, keyed := fuzzNodes(f)
	f.Fuzz(func(t *testing.T, kind uint8, part uint32, epoch uint64, owner string, inc uint64, released bool,
		version uint64, members string, signer uint8, join bool, svc string) {
		var k *ownership.Keyring
		switch signer % 3 {
		case 1:
			k = keys
		case 2:
			k = other
		}
		var names []string
		if members != "" {
			names = strings.Split(members, ",")
		}
		st := quorum.NewStable(version, names)
		claim := gossip.Claim{Token: k.Sign(ownership.Token{Partition: part % (2 * testPartitions), Epoch: epoch, Owner: owner, Incarnation: inc}), Released: released}
		m := gossip.Message{Kind: gossip.Kind(kind%6 + 1), Cluster: "tenure", Sender: "fz-peer", Claim: claim, Stable: st}
		if m.Kind >= gossip.KindState && m.Kind != gossip.KindAskStable {
			reg, err := gossip.NewRegister(testPartitions)
			if err != nil {
				t.Fatal(err)
			}
			reg.ObserveClaim(claim)
			m.Register, m.Digest = reg, reg.Digest()
			if m.Kind == gossip.KindSection {
				m.Section.Partitions, m.Section.Ranges, m.Section.Ask = testPartitions, []int{0}, released
				if s := reg.Sections([]int{gossip.RangeOf(testPartitions, claim.Token.Partition)}, 4); len(s) > 0 {
					m.Section = s[0]
					m.Section.Ask = released
				}
			}
		}
		msg, sealErr := m.Seal(k)
		md, metaErr := meta{Cluster: "tenure", RingVersion: ring.AlgorithmVersion, Incarnation: inc, ServiceAddr: svc, Stable: st.ID(), Leaving: released}.encode("fz-peer", k)
		for _, c := range []*Coordinator{plain, keyed} {
			if sealErr == nil {
				d := &delegate{c: c}
				// On the wrong channel: dropped, whoever signed it.
				n := dropped(c)
				wrong, own := func() { d.MergeRemoteState(msg, join) }, func() { d.NotifyMsg(msg) }
				if m.Kind.Channel() == gossip.PushPull {
					wrong, own = own, wrong
				}
				if p := panicOf(wrong); p != nil {
					t.Fatalf("%s: a %v message on the wrong channel panicked: %v", c.cfg.Name, m.Kind, p)
				}
				if got := dropped(c) - n; got != 1 {
					t.Fatalf("%s: a %v message on the wrong channel: %v dropped, want 1", c.cfg.Name, m.Kind, got)
				}
				// On its own channel, under a key the node does not hold.
				if c == keyed && signer%3 != 1 {
					n := dropped(c)
					if p := panicOf(own); p != nil {
						t.Fatalf("%s: a %v message panicked: %v", c.cfg.Name, m.Kind, p)
					}
					if got := dropped(c) - n; got != 1 {
						t.Fatalf("%s: a %v message signed by %d: %v dropped, want 1", c.cfg.Name, m.Kind, signer%3, got)
					}
				}
				feedAll(t, c, msg, join)
			}
			if metaErr == nil {
				feedAll(t, c, md, join)
			}
			loopAlive(t, c)
		}
	})
}
