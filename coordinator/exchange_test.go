package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// remac returns cl with its MAC set to m: in an unkeyed cluster the same
// claim, which the register keeps over the zero MAC (the greater MAC wins)
// and the machine takes as nothing new, so it moves no partition.
func remac(cl gossip.Claim, m byte) gossip.Claim {
	for i := range cl.Token.MAC {
		cl.Token.MAC[i] = m
	}
	return cl
}

// Issue 22: push/pull carries digests, and registers that diverged
// converge through the digest exchange alone. The registers of a settled
// three-node cluster are made to differ behind gossip's back (claims put
// in one node's register, never broadcast: d0 and d2 each hold claims the
// others lack, in ranges of their own); nothing but a digest that differs
// can bring them across, and nobody joins, so no whole register travels.
// They must converge, by sections, in both directions (d0's claims in its
// asking sections, d2's in the answers).
func TestDigestExchangeConvergesDivergedRegisters(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "d", 3)
	tc.waitConverged(ctx)
	nodes := tc.all()
	testkit.WaitFor(ctx, t, "the registers to agree", func() bool { return sameRegisters(nodes) == nil })
	// and the stable membership to settle: a node that sees a newer one
	// syncs, by a whole register, which this test must not count.
	testkit.WaitFor(ctx, t, "every node to count against the same stable membership of 3", func() bool {
		first := nodes[0].c.stable.Load()
		for _, n := range nodes {
			st := n.c.stable.Load()
			if len(st.Members) != len(nodes) || st.Version != first.Version {
				return false
			}
		}
		return true
	})

	whole := func() (n uint64) {
		for _, x := range nodes {
			n += x.c.traffic.wholeStates.Load()
		}
		return n
	}
	sections := func() (n uint64) {
		for _, x := range nodes {
			n += x.c.traffic.sections.Load()
		}
		return n
	}
	whole0, sections0 := whole(), sections()
	// testPartitions is 32: one partition per range.
	planted := map[uint32]gossip.Claim{}
	for name, parts := range map[string][]uint32{"d0": {1, 10, 31}, "d2": {5, 20}} {
		c := tc.node(name).c
		for _, p := range parts {
			cl := remac(c.reg.GetClaim(p), byte(p+1))
			if cl.Token.IsZero() || !c.reg.ObserveClaim(cl) {
				t.Fatalf("planting %v in %s", cl, name)
			}
			planted[p] = cl
		}
	}
	// A few push/pulls are enough; a digest blind to a range never gets
	// there. The wait is counted in push/pulls, not time, so a loaded
	// machine does not fail it and a blind digest fails it soon.
	digests := func(n *testNode) uint64 { return n.c.traffic.states.Load() - n.c.traffic.wholeStates.Load() }
	base := map[string]uint64{}
	for _, n := range nodes {
		base[n.name] = digests(n)
	}
	const rounds = 15
	testkit.WaitFor(ctx, t, "the planted claims to reach every node", func() bool {
		agreed := sameRegisters(nodes) == nil
		for _, n := range nodes {
			for p, cl := range planted {
				if got := n.c.reg.GetClaim(p); got != cl {
					agreed = false
				}
			}
		}
		if agreed {
			return true
		}
		for _, n := range nodes {
			if digests(n)-base[n.name] < rounds {
				return false
			}
		}
		t.Fatalf("after %d push/pulls of every node the planted claims have not spread: %v", rounds, sameRegisters(nodes))
		return false
	})
	if got := whole() - whole0; got != 0 {
		t.Fatalf("%d whole registers travelled (a join or a sync): the test is about digests alone", got)
	}
	if sections() == sections0 {
		t.Fatal("the registers converged without a section sent")
	}
	t.Logf("sections sent: %d", sections()-sections0)
}

// sameRegisters returns nil when nodes' registers hold the same claims.
func sameRegisters(nodes []*testNode) error {
	var first []byte
	for i, n := range nodes {
		b, err := n.c.reg.MarshalBinary()
		if err != nil {
			return err
		}
		if i == 0 {
			first = b
		} else if !bytes.Equal(b, first) {
			return fmt.Errorf("%s's register differs from %s's", n.name, nodes[0].name)
		}
	}
	return nil
}

// In a keyed cluster a section is opened as any gossip: a claim in it
// that is not signed under the cluster's keys (in a section sealed under
// them, as a keyholder relaying a forgery would), or a section sealed
// under another key, is dropped and changes nothing; an authentic one is
// merged (the lease it supersedes ends).
func TestKeyedSectionWithForgedClaimDropped(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	other := metaKeys(t, "another cluster's token key....")
	tc := newTestCluster(t, func(c *Config) { c.TokenKeys = keys })
	tc.startNodes(ctx, "k", 2)
	const p = 3
	owner, lease := ownerOf(t, tc, p)
	next := lease.Token()
	next.Epoch++
	section := func(tok ownership.Token) gossip.Section {
		return gossip.Section{Partitions: testPartitions, Ranges: []int{gossip.RangeOf(testPartitions, p)},
			Claims: []gossip.Claim{{Token: tok, Released: true}}, Ask: true}
	}
	in := newIntruder(t, "evil", nil, nil)
	before := droppedNow(tc.all())
	msg := func(s gossip.Section, k *ownership.Keyring) []byte {
		return seal(t, gossip.Message{Kind: gossip.KindSection, Cluster: "tenure", Sender: owner.name, Section: s}, k)
	}
	in.sendTo(t, tc.all(), msg(section(next), keys))              // an unsigned claim in a signed section
	in.sendTo(t, tc.all(), msg(section(other.Sign(next)), other)) // sealed under another key
	waitDropped(ctx, t, tc.all(), before, 4)
	if lease.Err() != nil {
		t.Fatalf("a forged claim in a section ended the owner's lease: %v", lease.Err())
	}
	for _, n := range tc.all() {
		if cl := n.c.reg.GetClaim(p); cl.Token.Epoch != lease.Token().Epoch || cl.Released {
			t.Fatalf("%s believed a forged claim in a section: %v", n.name, cl)
		}
	}
	// The control: the same section, authentic, is merged.
	in.sendTo(t, []*testNode{owner}, msg(section(keys.Sign(next)), keys))
	select {
	case <-lease.Done():
	case <-ctx.Done():
		t.Fatal("an authentic section was not merged")
	}
}

// The delegate never blocks on the digest exchange: beyond exchangeQueue
// sends waiting, what it offers is dropped and counted.
func TestExchangeQueueIsBounded(t *testing.T) {
	cfg := testConfig("q")
	cfg.Handler = nopHandler{}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range exchangeQueue + 5 {
		c.offerExchange(exchangeJob{peer: "x", ranges: []int{0}})
	}
	if got := c.traffic.exchangeDropped.Load(); got != 5 {
		t.Fatalf("%d sends dropped, want 5", got)
	}
}

// The figures of a push/pull state (issue 22): a quiet one (a digest) and
// a join's (the whole register), unkeyed and keyed, at 271, 4096 and 8192
// partitions, every partition claimed by one of 10 owners. Printed by
// TestFigures through printStateFigures.
func stateSizes(t *testing.T, partitions int, keys *ownership.Keyring) (digest, whole int) {
	reg, err := gossip.NewRegister(partitions)
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(partitions) {
		reg.Observe(keys.Sign(ownership.Token{Partition: p, Epoch: 3, Owner: fmt.Sprintf("s%d", p%10), Incarnation: 0x1234567890abcdef}))
	}
	m := gossip.Message{Kind: gossip.KindDigest, Cluster: "tenure", Sender: "s0", Digest: reg.Digest()}
	d := seal(t, m, keys)
	m.Kind, m.Register = gossip.KindState, reg
	w := seal(t, m, keys)
	return len(d), len(w)
}

func printStateFigures(t *testing.T) {
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	for _, p := range []int{271, 4096, 8192} {
		for name, k := range map[string]*ownership.Keyring{"plain": nil, "keyed": keys} {
			d, w := stateSizes(t, p, k)
			fmt.Printf("figure: gossip.pushpull_state_bytes.%d.%s %d\n", p, name, d)
			fmt.Printf("figure: gossip.join_state_bytes.%d.%s %d\n", p, name, w)
		}
	}
}
