package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
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
	// syncs, by a stable ask and, if that doesn't do, a whole register,
	// which this test must not count.
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
	// trial plants diverging claims and waits for them to spread; false
	// when the membership moved meanwhile (see disturbed).
	var whole0, sections0 uint64
	trial := func(salt byte) bool {
		whole0, sections0 = whole(), sections()
		// testPartitions is 32: one partition per range.
		planted := map[uint32]gossip.Claim{}
		// disturbed says whether the membership moved during the trial: a
		// planted partition claimed anew (a node lost its quorum and the
		// partition moved) or a whole register sent (a rejoin's sync). Under
		// load a 3-node cluster's failure detector can flap (issue 20); the
		// trial is then void, not failed, and runs again.
		disturbed := func() bool {
			if whole() != whole0 {
				return true
			}
			for _, n := range nodes {
				for p, cl := range planted {
					if n.c.reg.GetClaim(p).Token.Epoch > cl.Token.Epoch {
						return true
					}
				}
			}
			return false
		}
		for name, parts := range map[string][]uint32{"d0": {1, 10, 31}, "d2": {5, 20}} {
			c := tc.node(name).c
			for _, p := range parts {
				cl := remac(c.reg.GetClaim(p), byte(p+1)+64*(salt-1))
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
			if disturbed() {
				return true
			}
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
		if disturbed() { // a whole register sent among them: the test is about digests alone
			return false
		}
		if sections() == sections0 {
			t.Fatal("the registers converged without a section sent")
		}
		return true
	}
	for try := 1; !trial(byte(try)); try++ {
		if try == 3 {
			t.Fatalf("three trials in a row were disturbed (%d whole registers sent in the last, or a planted partition claimed anew): a sync or a join each time, a flapping cluster, or an exchange that sends whole registers", whole()-whole0)
		}
		t.Logf("trial %d disturbed (%d whole registers sent; if 0, a planted partition claimed anew); again", try, whole()-whole0)
		testkit.WaitFor(ctx, t, "the registers to agree again", func() bool { return sameRegisters(nodes) == nil })
	}
	var refused uint64
	for _, n := range nodes {
		refused += n.c.traffic.asksRefused.Load()
	}
	// An ask that beat its push/pull's digest is parked, not refused for good.
	t.Logf("sections sent: %d; asks not due on arrival: %d", sections()-sections0, refused)
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

// Issue 22 review: an asking section is some 30 bytes, may come by UDP,
// and may be a replay; its answer is up to the whole register by TCP.
// Every copy was answered, so a trickle of replays filled the exchange's
// queue (exchangeQueue jobs) and kept it full. Now an ask of member P is
// answered only for ranges in which P's digest, merged at most askWindow
// ago, differed from this node's, each range once; an ask that comes
// before its digest waits for it; digests open ranges at most once per
// askWindow/2; and nobody but a member is answered, nor remembered after
// it leaves. The node is not started: what the delegate queues stays in
// c.exch, to be counted.
func TestAsksAreAnsweredOnlyWhenDue(t *testing.T) {
	clock := &manualClock{now: time.Unix(1e9, 0)}
	cfg := testConfig("b") // sorts after "a": a asks, b answers
	cfg.Handler = nopHandler{}
	cfg.Clock = clock
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := &delegate{c: c}
	join := func(name string) *memberlist.Node {
		md, err := meta{Cluster: cfg.ClusterName, RingVersion: ring.AlgorithmVersion, Incarnation: 1, ServiceAddr: "s:1"}.encode(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := &memberlist.Node{Name: name, Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: md}
		d.NotifyJoin(n)
		return n
	}
	a := join("a")
	// a's register differs from b's (empty) in ranges 3 and 5.
	theirs, _ := gossip.NewRegister(testPartitions)
	for _, p := range []uint32{3, 5} {
		theirs.Observe(ownership.Token{Partition: p, Epoch: 1, Owner: "a", Incarnation: 1})
	}
	digest := seal(t, gossip.Message{Kind: gossip.KindDigest, Cluster: cfg.ClusterName, Sender: "a", Digest: theirs.Digest()}, nil)
	ask := func(from string, ranges ...int) []byte {
		return seal(t, gossip.Message{Kind: gossip.KindSection, Cluster: cfg.ClusterName, Sender: from,
			Section: gossip.Section{Partitions: testPartitions, Ranges: ranges, Ask: true}}, nil)
	}
	queued := func(want int, what string) {
		t.Helper()
		if len(c.exch) != want {
			t.Fatalf("%s: %d answers queued, want %d", what, len(c.exch), want)
		}
	}

	// Replayed with no differing digest: refused, and the queue stays empty.
	for range 3 * exchangeQueue {
		d.NotifyMsg(ask("a", 3))
	}
	queued(0, "an ask replayed without a differing digest")
	if got := c.traffic.asksRefused.Load(); got != 3*exchangeQueue {
		t.Fatalf("%d asks refused, want %d", got, 3*exchangeQueue)
	}
	// The push/pull's digest: the last ask, parked, is answered now; a
	// replay of it is not, nor an ask for a range that did not differ.
	d.MergeRemoteState(digest, false)
	queued(1, "the digest after a parked ask")
	d.NotifyMsg(ask("a", 3))
	d.NotifyMsg(ask("a", 4))
	queued(1, "a replay, and an ask of a range that did not differ")
	// An ask of a range that differed and one that did not (a's register
	// moved between its digest and its ask) is answered for the first.
	d.NotifyMsg(ask("a", 4, 5))
	queued(2, "an ask of the other range that differed, and one that did not")
	if j := <-c.exch; len(j.answer.Ranges) != 1 || j.answer.Ranges[0] != 3 {
		t.Fatalf("the first answer is for ranges %v, want [3]", j.answer.Ranges)
	}
	if j := <-c.exch; len(j.answer.Ranges) != 1 || j.answer.Ranges[0] != 5 {
		t.Fatalf("the answer of an ask of [4 5] is for ranges %v, want [5]", j.answer.Ranges)
	}
	queued(0, "the two answers taken")
	d.NotifyMsg(ask("a", 5))
	queued(0, "a replay of the answered range")
	// Another digest within askWindow/2 opens nothing.
	clock.advance(c.askWindow/2 - time.Millisecond)
	d.MergeRemoteState(digest, false)
	d.NotifyMsg(ask("a", 3))
	queued(0, "an ask after a digest too soon")
	// After it, a digest opens the ranges again, for askWindow: the ask
	// parked just now is answered.
	clock.advance(time.Millisecond)
	d.MergeRemoteState(digest, false)
	queued(1, "the parked asks, after a digest in time")
	if j := <-c.exch; fmt.Sprint(j.answer.Ranges) != "[3 5]" {
		t.Fatalf("the parked asks of [4 5], [4], [5] and [3] are answered for ranges %v, want [3 5]", j.answer.Ranges)
	}
	clock.advance(c.askWindow + time.Millisecond)
	d.NotifyMsg(ask("a", 5))
	queued(0, "an ask after the window")
	// A clock stepped back an hour: the next digest opens the ranges
	// again, not an hour and a half window later.
	clock.advance(-time.Hour)
	d.MergeRemoteState(digest, false)
	queued(1, "the parked ask, after a digest once the clock stepped back")
	<-c.exch
	d.NotifyMsg(ask("a", 3))
	queued(1, "the ask of the other range, the clock stepped back")
	<-c.exch

	// A non-member, digest or not, is never answered, nor remembered.
	stranger := seal(t, gossip.Message{Kind: gossip.KindDigest, Cluster: cfg.ClusterName, Sender: "0", Digest: theirs.Digest()}, nil)
	clock.advance(c.askWindow)
	d.NotifyMsg(ask("0", 3))
	d.MergeRemoteState(stranger, false)
	d.NotifyMsg(ask("0", 3))
	queued(0, "a non-member's asks")
	// A member that leaves is forgotten: its parked ask too.
	d.NotifyMsg(ask("a", 3))
	d.NotifyLeave(a)
	c.nodes.mu.Lock()
	n := len(c.nodes.asks)
	c.nodes.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d members' asks remembered, after the only member left", n)
	}
	join("a")
	d.MergeRemoteState(digest, false)
	queued(0, "the digest of a member that rejoined, its ask parked before it left")
	d.NotifyMsg(ask("a", 3))
	queued(1, "the ask of a member that rejoined, after its digest")
	<-c.exch
	// Range 5 is still open, but not past the window.
	clock.advance(c.askWindow + time.Millisecond)
	d.NotifyMsg(ask("a", 5))
	queued(0, "an ask of an open range after the window")
}

// Issue 22 review: one claim of a keyed section that did not verify (a
// claim signed under a key this node no longer holds, during a key
// rotation) dropped the whole section, its good claims and its answer,
// which stopped repair both ways. Now the claim alone is dropped, counted
// (gossipDropped, once per claim) and logged, at most once per
// unverifiedLogEvery however many arrive; the good claims are merged and
// the ask is answered.
func TestUnverifiedClaimsAreDroppedAlone(t *testing.T) {
	keys := metaKeys(t, fuzzKey)
	retired := metaKeys(t, "a retired token key, 32 bytes..")
	clock := &manualClock{now: time.Unix(1e9, 0)}
	cfg := testConfig("b")
	cfg.Handler = nopHandler{}
	cfg.Clock = clock
	cfg.TokenKeys = keys
	logs := newLogCapture()
	cfg.Logger = slog.New(logs)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := &delegate{c: c}
	md, err := meta{Cluster: cfg.ClusterName, RingVersion: ring.AlgorithmVersion, Incarnation: 1, ServiceAddr: "s:1"}.encode("a", keys)
	if err != nil {
		t.Fatal(err)
	}
	d.NotifyJoin(&memberlist.Node{Name: "a", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: md})
	theirs, _ := gossip.NewRegister(testPartitions)
	good := gossip.Claim{Token: keys.Sign(ownership.Token{Partition: 3, Epoch: 1, Owner: "a", Incarnation: 1})}
	stale := gossip.Claim{Token: retired.Sign(ownership.Token{Partition: 5, Epoch: 1, Owner: "a", Incarnation: 1})}
	theirs.ObserveClaim(good)
	theirs.ObserveClaim(stale)
	d.MergeRemoteState(seal(t, gossip.Message{Kind: gossip.KindDigest, Cluster: cfg.ClusterName, Sender: "a", Digest: theirs.Digest()}, keys), false)
	sections := theirs.Sections([]int{3, 5}, 10)
	if len(sections) != 1 {
		t.Fatalf("%d sections", len(sections))
	}
	ask := seal(t, gossip.Message{Kind: gossip.KindSection, Cluster: cfg.ClusterName, Sender: "a", Section: sections[0]}, keys)
	before := dropped(c)
	d.NotifyMsg(ask)
	c.inbox.mu.Lock()
	var heardClaims []gossip.Claim
	for _, h := range c.inbox.items {
		heardClaims = append(heardClaims, h.claims...)
	}
	c.inbox.mu.Unlock()
	if len(heardClaims) != 1 || heardClaims[0] != good {
		t.Fatalf("heard %v from a section of %v and %v (under a retired key), want the first alone", heardClaims, good, stale)
	}
	if len(c.exch) != 1 {
		t.Fatalf("%d answers queued to a section with one claim under a retired key, want 1", len(c.exch))
	}
	if got := dropped(c) - before; got != 1 || c.traffic.unverified.Load() != 1 {
		t.Fatalf("%v dropped, %d unverified counted, want 1 and 1", got, c.traffic.unverified.Load())
	}
	// A flood of them: each counted, one line logged per unverifiedLogEvery.
	for range 100 {
		d.NotifyMsg(ask)
	}
	clock.advance(unverifiedLogEvery)
	d.NotifyMsg(ask)
	lines := logs.records(func(r logRecord) bool { return strings.HasPrefix(r.msg, "dropped claims whose tokens did not verify") })
	if got := dropped(c) - before; got != 102 || len(lines) != 2 {
		t.Fatalf("102 sections of one unverified claim: %v dropped and %d lines logged, want 102 and 2", got, len(lines))
	}
}

// Issue 22: a node behind asks a member that shows a newer stable
// membership for it with a stable ask, which the member answers with its
// own (where a push/pull sent the whole register both ways). An ask can be
// replayed: the delegate queues an answer only when this node's stable
// membership is newer than the asker's, and only for members, and what
// doesn't fit in the queue is dropped; the sender sends one answer per
// stable membership and at most one per askWindow/2 per member
// (stableDue), recorded only once sent. The node is not started: what the
// delegate queues stays in c.stableCh, to be counted.
func TestStableAsksAreAnsweredOnlyWhenDue(t *testing.T) {
	clock := &manualClock{now: time.Unix(1e9, 0)}
	cfg := testConfig("b")
	cfg.Handler = nopHandler{}
	cfg.Clock = clock
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	own := quorum.NewStable(3, []string{"a", "b"})
	c.stable.Store(&own)
	d := &delegate{c: c}
	md, err := meta{Cluster: cfg.ClusterName, RingVersion: ring.AlgorithmVersion, Incarnation: 1, ServiceAddr: "s:1"}.encode("a", nil)
	if err != nil {
		t.Fatal(err)
	}
	d.NotifyJoin(&memberlist.Node{Name: "a", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: md})
	ask := func(from string, s quorum.Stable) []byte {
		return seal(t, gossip.Message{Kind: gossip.KindAskStable, Cluster: cfg.ClusterName, Sender: from, Stable: s}, nil)
	}
	older := quorum.NewStable(2, []string{"a", "b"})
	queued := func(want int, what string) {
		t.Helper()
		if len(c.stableCh) != want {
			t.Fatalf("%s: %d answers queued, want %d", what, len(c.stableCh), want)
		}
		for range want {
			if name := <-c.stableCh; name != "a" {
				t.Fatalf("%s: an answer queued for %q, want a", what, name)
			}
		}
	}
	d.NotifyMsg(ask("a", older))
	queued(1, "an ask with an older stable membership")
	d.NotifyMsg(ask("a", own))
	d.NotifyMsg(ask("a", quorum.NewStable(4, []string{"a", "b"})))
	d.NotifyMsg(ask("0", older))
	queued(0, "asks with the same and a newer stable membership, and a non-member's")
	if got := c.traffic.stableRefused.Load(); got != 3 {
		t.Fatalf("%d stable asks refused, want 3", got)
	}
	for range 3 * exchangeQueue {
		d.NotifyMsg(ask("a", quorum.Stable{}))
	}
	if got := c.traffic.stableRefused.Load(); got != 3+2*exchangeQueue {
		t.Fatalf("a flood of asks: %d refused, want %d (what doesn't fit the queue)", got, 3+2*exchangeQueue)
	}
	queued(exchangeQueue, "a flood of asks")

	// The sender's rule.
	due := func(id quorum.StableID, mark bool) bool {
		return c.nodes.stableDue("a", id, clock.Now(), c.askWindow, mark)
	}
	if !due(own.ID(), true) {
		t.Fatal("the first answer is not due")
	}
	if due(own.ID(), true) {
		t.Fatal("a second answer with the same stable membership is due at once")
	}
	if next := quorum.NewStable(4, []string{"a", "b", "c"}).ID(); !due(next, false) {
		t.Fatal("an answer with another stable membership is not due")
	}
	clock.advance(c.askWindow/2 - time.Millisecond)
	if due(own.ID(), false) {
		t.Fatal("the same answer is due within askWindow/2")
	}
	clock.advance(time.Millisecond)
	if !due(own.ID(), false) {
		t.Fatal("the same answer is not due after askWindow/2")
	}
	sent := clock.Now()
	due(own.ID(), true)
	clock.advance(-time.Hour)
	if !due(own.ID(), false) {
		t.Fatal("an answer is not due once the clock stepped back")
	}
	clock.advance(time.Hour)
	c.nodes.unmarkStable("a", sent)
	if !due(own.ID(), false) {
		t.Fatal("an answer whose send failed (unmarked) is not due")
	}
	if c.nodes.stableDue("0", own.ID(), clock.Now(), c.askWindow, true) {
		t.Fatal("an answer to a non-member is due")
	}
}

// convergedPair starts two nodes, k0 and k1, and waits until they converge.
func convergedPair(ctx context.Context, t *testing.T) (k0, k1 *Coordinator) {
	t.Helper()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "k", 2)
	tc.waitConverged(ctx)
	return tc.node("k0").c, tc.node("k1").c
}

// A stable ask over real gossip: a member whose stable membership is
// newer than the asker's answers it, by a message of a few hundred bytes
// and not by a push/pull of the whole register.
func TestStableAskIsAnswered(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := convergedPair(ctx, t)
	whole := a.traffic.wholeStates.Load() + b.traffic.wholeStates.Load()
	// b asks as a node behind would: with an older stable membership.
	if err := b.sendStable("k0", gossip.KindAskStable, quorum.Stable{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "k0 to answer k1's stable ask", func() bool { return a.traffic.stableAnswers.Load() == 1 })
	if got := a.traffic.wholeStates.Load() + b.traffic.wholeStates.Load(); got != whole {
		t.Errorf("%d whole states sent during a stable ask, want none", got-whole)
	}
}

// A node that sees a member show a newer stable membership asks it for
// it with a stable ask, not a push/pull, and escalates to a push/pull of
// whole states only after syncByStateAfter asks: k0 shows a newer ID than
// it has (its metadata alone, so it can't answer), k1 asks it
// syncByStateAfter times and then pulls its state.
func TestSyncAsksForTheStableMembership(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := convergedPair(ctx, t)
	received := func() uint64 { return a.traffic.stableRefused.Load() + a.traffic.stableAnswers.Load() }
	asked, states := received(), b.traffic.stateSyncs.Load()
	next := a.stable.Load().ID()
	next.Version++
	if err := a.updateMeta(func(m *meta) { m.Stable = next }); err != nil {
		t.Fatal(err)
	}
	if err := a.pushMeta(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "k1 to ask k0 for the stable membership k0 shows", func() bool { return received() > asked })
	testkit.WaitFor(ctx, t, "k1 to pull k0's state once its asks didn't bring it up to date", func() bool {
		return b.traffic.stateSyncs.Load() > states
	})
	testkit.WaitFor(ctx, t, "the asks sent before the push/pull to arrive", func() bool { return received()-asked >= syncByStateAfter })
	if got := received() - asked; got != syncByStateAfter {
		t.Errorf("k0 got %d stable asks for one stable membership, want %d before the push/pull", got, syncByStateAfter)
	}
}
