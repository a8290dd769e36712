package coordinator

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// fenceLog is a Fence that records when each token was fenced.
type fenceLog struct {
	f  *ownership.MemoryFence
	mu sync.Mutex
	at []fencedAt
}

type fencedAt struct {
	tok ownership.Token
	at  time.Time
}

func (l *fenceLog) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	cur, err := l.f.Fence(ctx, t)
	if err == nil {
		l.mu.Lock()
		l.at = append(l.at, fencedAt{tok: t, at: time.Now()})
		l.mu.Unlock()
	}
	return cur, err
}

// fencedBy returns the first fence after since by one of nodes.
func (l *fenceLog) fencedBy(nodes []*testNode, since time.Time) (fencedAt, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.at {
		if f.at.After(since) && slices.ContainsFunc(nodes, func(n *testNode) bool { return n.name == f.tok.Owner }) {
			return f, true
		}
	}
	return fencedAt{}, false
}

// loggedFaultCluster is a faultCluster whose nodes fence through a fenceLog.
func loggedFaultCluster(t *testing.T, tweak func(*Config)) (*testCluster, *faultnet.Network, *fenceLog) {
	log := &fenceLog{}
	tc, fn := faultCluster(t, func(c *Config) {
		c.Fence = log
		if tweak != nil {
			tweak(c)
		}
	})
	log.f = tc.fence
	return tc, fn, log
}

// watchQuiet checks, for d, that no node in quiet holds a lease, counts a
// quorum, or fences anything. It returns the first breach it saw, or "".
func watchQuiet(ctx context.Context, log *fenceLog, quiet []*testNode, d time.Duration) string {
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		for _, n := range quiet {
			if k := n.c.ownedCount(); k != 0 {
				return n.name + " holds leases"
			}
			if n.c.Status().Quorum {
				return n.name + " counts a quorum"
			}
		}
		if f, ok := log.fencedBy(quiet, start); ok {
			return "it fenced " + f.tok.String()
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond): // watching that nothing happens
		}
	}
	return ""
}

// Issue 11, defect 4: a node restarted on the minority side of a split
// (and a new node that joins there) took its first view as the stable
// membership, counted a quorum at once and fenced the majority's
// partitions: in 8 s one node held 10 leases. It must hear the cluster's
// stable membership from the peer it joins and hold back.
func TestRestartOnMinoritySideHoldsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	// A short grace: a node that wrongly counted a quorum would claim the
	// partitions of the members it can't see after it.
	tc, fn, log := loggedFaultCluster(t, func(c *Config) { c.Grace = time.Second })
	tc.startNodes(ctx, "m", 5)
	major := []*testNode{tc.node("m0"), tc.node("m1"), tc.node("m2")}
	if err := fn.Partition(names(major), []string{"m3", "m4", "m5"}); err != nil {
		t.Fatal(err)
	}
	m3 := tc.node("m3")
	testkit.WaitFor(ctx, t, "the minority to step down", func() bool { return m3.c.ownedCount() == 0 && tc.node("m4").c.ownedCount() == 0 })

	// m4 restarts, and m5 is new; both join m3, on their side of the cut.
	tc.remove("m4").c.Close()
	tc.seed = m3.c.GossipAddr()
	m4 := tc.start(ctx, "m4")
	m5 := tc.start(ctx, "m5")
	testkit.WaitFor(ctx, t, "the restarted node to see its side", func() bool {
		return m4.c.Table().Len() == 3 && m5.c.Table().Len() == 3
	})
	if breach := watchQuiet(ctx, log, []*testNode{m3, m4, m5}, m4.c.cfg.Grace+1500*time.Millisecond); breach != "" {
		t.Fatalf("on the minority side after a restart and a join: %s", breach)
	}
	// It knows only 2 of the cluster's 5 (m3 and itself): it holds the
	// cluster's set unadopted (a forged one must not halt it) and is
	// outdated, as m3 shows a newer one; it counts against no set of its
	// own making.
	if st := m4.c.Status(); len(st.Stable) != 5 && len(st.Stable) != 0 {
		t.Fatalf("the restarted node counts against %v, not the cluster's stable membership", st.Stable)
	}
}

// Issue 20 (issue 11's defect 4, as it failed under load): a node that
// joins takes its seed's member list whole. While it starts, it counts no
// member it has had no word from directly. Here h3 joins through h2, which
// reaches everyone, while h3 itself reaches neither h0 nor h1 (h2 relays
// the indirect probes, so memberlist lists them alive). On h2's word
// alone, h3 counted 4 of the 4 stable members and had a quorum within a
// tick of its start. It must hold back through its start window, and
// count them after it: a node that reaches some members only through
// others is not shut out for good.
func TestJoinerCountsNoHearsayWhileStarting(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, fn, _ := loggedFaultCluster(t, nil)
	tc.startNodes(ctx, "h", 3)
	if err := fn.Partition([]string{"h0", "h1"}, []string{"h3"}); err != nil {
		t.Fatal(err)
	}
	tc.seed = tc.node("h2").c.GossipAddr()
	h3 := tc.start(ctx, "h3")
	started := time.Now()
	// The window is reachHold by the node's clock, from its loop's start,
	// which was before Start returned: watch half of it, by the wall clock.
	window := reachHold(h3.c.cfg)
	sawAll := false
	for time.Since(started) < window/2 && ctx.Err() == nil {
		st := h3.c.Status()
		if st.Quorum {
			t.Fatalf("h3 counted a quorum %v after its start, on its seed's word for h0 and h1 (stable %v, sees %d members, unheard %v, unreachable %v)",
				time.Since(started).Round(time.Millisecond), st.Stable, len(st.Members), st.Unheard, st.Unreachable)
		}
		if st.Owned != 0 {
			t.Fatalf("h3 holds %d leases while starting", st.Owned)
		}
		sawAll = sawAll || len(st.Members) == 4 && slices.Equal(st.Unheard, []string{"h0", "h1"})
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond): // watching that nothing happens
		}
	}
	if !sawAll {
		t.Fatalf("h3 never listed all four members with h0 and h1 unheard in the first %v (last: %d members, unheard %v)",
			window/2, len(h3.c.Status().Members), h3.c.Status().Unheard)
	}
	testkit.WaitFor(ctx, t, "h3 to count a quorum after its start window (h0 and h1 reach it through h2)", func() bool {
		st := h3.c.Status()
		return st.Quorum && len(st.Unheard) == 0
	})
}

// Only the list a node took from its seed is hearsay, with the lives it
// sees later that were members before (reach.Heard): new processes that
// join after it came to the cluster themselves. A founding node that held
// those back too (until it had pinged them) didn't grow the stable
// membership at once, and a crash in the cluster's first second left it
// counting against {n0, n1} for good (TestBroadcastQueueCountsMembers and
// TestReshapedSplitHasOneQuorum failed so). Here g2 joins through g1 and
// the founder g0 can't reach it, so g0 never has word from it: g0 must
// count it anyway, from its start on. A long Grace makes the start window
// (2 x Grace) outlast a loaded machine's slow starts.
func TestHearsayIsOnlyTheJoinsList(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, fn, _ := loggedFaultCluster(t, func(c *Config) { c.Grace = 10 * time.Second })
	if err := fn.Partition([]string{"g0"}, []string{"g2"}); err != nil {
		t.Fatal(err)
	}
	g0 := tc.start(ctx, "g0")
	started := time.Now()
	g1 := tc.start(ctx, "g1")
	tc.seed = g1.c.GossipAddr()
	tc.start(ctx, "g2")
	window := reachHold(g0.c.cfg)
	var sawAll time.Time // when g0 first listed all three members
	for time.Since(started) < window/2 && ctx.Err() == nil {
		st := g0.c.Status()
		if len(st.Unheard) != 0 {
			t.Fatalf("the founder g0 holds %v back as hearsay, %v after its start", st.Unheard, time.Since(started).Round(time.Millisecond))
		}
		if sawAll.IsZero() && len(st.Members) == 3 {
			sawAll = time.Now()
		}
		if !sawAll.IsZero() && time.Since(sawAll) > time.Second {
			return // a second of views with g2 in them, none holding it back
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond): // watching that nothing happens
		}
	}
	t.Fatalf("g0 listed all three members for less than a second of the first %v (since %v): the test proves nothing", window/2, sawAll)
}

// Issue 11, defect 5: after a split reshapes, {a,b}|{c,d,e} held past
// StableAfter and then {a,b,c}|{d,e}, both sides kept a quorum: {a,b,c}
// counted 3 of the old five, {d,e} 2 of {c,d,e}. Only {d,e} may: c brings
// the newer stable membership {c,d,e} to a and b.
func TestReshapedSplitHasOneQuorum(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc, fn, log := loggedFaultCluster(t, func(c *Config) { c.StableAfter = 2 * time.Second })
	tc.startNodes(ctx, "s", 5)
	a, b, c, d, e := tc.node("s0"), tc.node("s1"), tc.node("s2"), tc.node("s3"), tc.node("s4")
	if err := fn.Partition(names([]*testNode{a, b}), names([]*testNode{c, d, e})); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "{c,d,e} to become the stable membership", func() bool {
		for _, n := range []*testNode{c, d, e} {
			if !slices.Equal(n.c.Status().Stable, []string{"s2", "s3", "s4"}) {
				return false
			}
		}
		return true
	})

	if err := fn.Partition(names([]*testNode{a, b, c}), names([]*testNode{d, e})); err != nil {
		t.Fatal(err)
	}
	abc := []*testNode{a, b, c}
	testkit.WaitFor(ctx, t, "{a,b,c} to hold nothing", func() bool {
		for _, n := range abc {
			if n.c.ownedCount() != 0 || n.c.Status().Quorum {
				return false
			}
		}
		return true
	})
	if breach := watchQuiet(ctx, log, abc, 3*a.c.cfg.StepDown+time.Second); breach != "" {
		t.Fatalf("both sides of the reshaped split count a quorum: on {a,b,c}, %s", breach)
	}
	for _, n := range []*testNode{d, e} {
		if !n.c.Status().Quorum {
			t.Fatalf("%s, on the side with the quorum, counts none", n.name)
		}
	}
}
