package coordinator

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// marks reads the fence's mark of every partition.
func marks(tc *testCluster) []ownership.Token {
	out := make([]ownership.Token, testPartitions)
	for p := range out {
		out[p] = tc.fence.Current(uint32(p))
	}
	return out
}

// watchQuiet checks, for d, that no node in quiet holds a lease or counts a
// quorum, and that the fence's marks stay as they are. It returns the
// first breach it saw, or "".
func watchQuiet(ctx context.Context, tc *testCluster, quiet []*testNode, d time.Duration) string {
	want := marks(tc)
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		for _, n := range quiet {
			if k := n.c.ownedCount(); k != 0 {
				return n.name + " holds leases"
			}
			if n.c.Status().Quorum {
				return n.name + " counts a quorum"
			}
		}
		if got := marks(tc); !slices.Equal(got, want) {
			for p := range got {
				if got[p] != want[p] {
					return "partition " + got[p].String() + " fenced, was " + want[p].String()
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond): // watching that nothing happens
		}
	}
	return ""
}

// startWriter runs a writer (see writer) until the test ends: a lease a
// claim on the far side of a cut fenced out during the detection spread
// learns it from its first rejected write (ReportStale), as an
// application's would.
func startWriter(t *testing.T, tc *testCluster, seed uint64) {
	w := &writer{tc: tc}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx, seed)
	}()
	t.Cleanup(func() { stop(); <-done })
}

// Issue 11, defect 4: a node restarted on the minority side of a split
// (and a new node that joins there) took its first view as the stable
// membership, counted a quorum at once and fenced the majority's
// partitions: in 8 s one node held 10 leases. It must learn the cluster's
// stable membership from the peer it joins and hold back.
func TestRestartOnMinoritySideHoldsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, nil)
	tc.startNodes(ctx, "m", 5)
	startWriter(t, tc, 4)
	major := []*testNode{tc.node("m0"), tc.node("m1"), tc.node("m2")}
	if err := fn.Partition(names(major), []string{"m3", "m4", "m5"}); err != nil {
		t.Fatal(err)
	}
	tc.waitConvergedAmong(ctx, major)
	m3 := tc.node("m3")
	waitFor(ctx, t, "the minority to step down", func() bool { return m3.c.ownedCount() == 0 && tc.node("m4").c.ownedCount() == 0 })

	// m4 restarts, and m5 is new; both join m3, on their side of the cut.
	tc.remove("m4").c.Close()
	tc.seed = m3.c.GossipAddr()
	m4 := tc.start(ctx, "m4")
	m5 := tc.start(ctx, "m5")
	waitFor(ctx, t, "the restarted node to see its side", func() bool {
		return m4.c.Table().Len() == 3 && m5.c.Table().Len() == 3
	})
	// A node that wrongly counted a quorum would claim the partitions of
	// the members it can't see after Grace.
	if breach := watchQuiet(ctx, tc, []*testNode{m3, m4, m5}, m4.c.cfg.Grace+1500*time.Millisecond); breach != "" {
		t.Fatalf("on the minority side after a restart and a join: %s", breach)
	}
	if st := m4.c.Status(); len(st.Stable) != 5 {
		t.Fatalf("the restarted node counts against %v, not the cluster's stable membership", st.Stable)
	}
}

// Issue 11, defect 5: after a split reshapes, {a,b}|{c,d,e} held past
// StableAfter and then {a,b,c}|{d,e}, both sides kept a quorum: {a,b,c}
// counted 3 of the old five, {d,e} 2 of {c,d,e}. Only {d,e} may: c brings
// the newer stable membership {c,d,e} to a and b.
func TestReshapedSplitHasOneQuorum(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, func(c *Config) { c.StableAfter = 2 * time.Second })
	tc.startNodes(ctx, "s", 5)
	startWriter(t, tc, 5)
	a, b, c, d, e := tc.node("s0"), tc.node("s1"), tc.node("s2"), tc.node("s3"), tc.node("s4")
	if err := fn.Partition(names([]*testNode{a, b}), names([]*testNode{c, d, e})); err != nil {
		t.Fatal(err)
	}
	tc.waitConvergedAmong(ctx, []*testNode{c, d, e})
	waitFor(ctx, t, "{c,d,e} to become the stable membership", func() bool {
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
	tc.waitConvergedAmong(ctx, []*testNode{d, e})
	abc := []*testNode{a, b, c}
	waitFor(ctx, t, "{a,b,c} to hold nothing", func() bool {
		for _, n := range abc {
			if n.c.ownedCount() != 0 || n.c.Status().Quorum {
				return false
			}
		}
		return true
	})
	if breach := watchQuiet(ctx, tc, abc, 3*a.c.cfg.StepDown+time.Second); breach != "" {
		t.Fatalf("both sides of the reshaped split count a quorum: on {a,b,c}, %s", breach)
	}
	for _, n := range []*testNode{d, e} {
		if !n.c.Status().Quorum {
			t.Fatalf("%s, on the side with the quorum, counts none", n.name)
		}
	}
}
