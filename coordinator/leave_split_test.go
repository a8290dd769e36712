package coordinator

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
)

// memberNames returns the names of the members n sees, sorted.
func memberNames(n *testNode) []string {
	var out []string
	for _, m := range n.c.Members() {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// Issue 19, defect 4: a member dropped while its metadata said Leaving
// counted as a graceful leave, goodbye heard or not, and the leave rule
// made the view that still counted the unreachable leaver the new stable
// set. Five nodes v0..v4; a split {v0,v1}|{v2,v3,v4} (the majority keeps
// its quorum; StableAfter is long, so nobody promotes a new set); v2
// starts to leave (v3 and v4 see it Leaving) and, while its handler still
// drains, the split moves to {v0,v1,v2}|{v3,v4}. v0 and v1 hear v2's
// goodbye and keep a quorum of {v0,v1}; v3 and v4 only see v2 go. Before
// the fix they counted that as a graceful leave from a view that held a
// quorum and shrank to {v3,v4}: both sides counted a quorum. Now the far
// side counts a crash and holds no quorum for as long as the split lasts.
func TestLeaveDuringSplitGivesOnlyOneSideAQuorum(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, func(c *Config) {
		c.StableAfter = 5 * time.Minute // no promotion during the test
		c.ReleaseTimeout = time.Minute  // the leaver's drain is held below
	})
	tc.startNodes(ctx, "v", 5)
	near, leaver, far := []*testNode{tc.node("v0"), tc.node("v1")}, tc.node("v2"), []*testNode{tc.node("v3"), tc.node("v4")}
	sees := func(nodes []*testNode, want ...string) func() bool {
		return func() bool {
			for _, n := range nodes {
				if !slices.Equal(memberNames(n), want) {
					return false
				}
			}
			return true
		}
	}
	if err := fn.Partition([]string{"v0", "v1"}, []string{"v2", "v3", "v4"}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "the first split to be seen", func() bool {
		return sees(near, "v0", "v1")() && sees(append([]*testNode{leaver}, far...), "v2", "v3", "v4")()
	})

	// The leaver's handler drains until let go: a write holds each gate.
	for p := range testPartitions {
		leaver.h.mu[p].RLock()
	}
	held := true
	letGo := func() {
		if held {
			held = false
			for p := range testPartitions {
				leaver.h.mu[p].RUnlock()
			}
		}
	}
	defer letGo()
	left := make(chan error, 1)
	go func() { left <- leaver.c.Leave(ctx) }()
	tc.remove("v2")
	testkit.WaitFor(ctx, t, "v3 and v4 to see v2 leaving", func() bool {
		for _, n := range far {
			if tab := n.c.Table(); tab == nil || tab.Has("v2") || !slices.Contains(memberNames(n), "v2") {
				return false
			}
		}
		return true
	})

	if err := fn.Partition([]string{"v0", "v1", "v2"}, []string{"v3", "v4"}); err != nil {
		t.Fatal(err)
	}
	// v0 and v1 find v2 again (the periodic rejoin) and lose v3 and v4
	// once more (v2's state showed them alive); v2 loses v3 and v4 too,
	// and they lose v2.
	testkit.WaitFor(ctx, t, "the second split to be seen", func() bool {
		return sees(append([]*testNode{leaver}, near...), "v0", "v1", "v2")() && sees(far, "v3", "v4")()
	})
	letGo()
	select {
	case err := <-left:
		if err != nil {
			t.Fatalf("leave: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the leave did not end")
	}
	testkit.WaitFor(ctx, t, "v0 and v1 to see v2 gone", sees(near, "v0", "v1"))

	// Well past StepDown and Grace: neither far node counts a quorum at
	// any moment, and the near side keeps one.
	state := func(n *testNode) string {
		st := n.c.Status()
		return fmt.Sprintf("%s: quorum %v, stable %v", n.name, st.Quorum, st.Stable)
	}
	deadline := time.Now().Add(2 * near[0].c.cfg.Grace)
	for time.Now().Before(deadline) {
		for _, n := range far {
			if st := n.c.Status(); st.Quorum {
				t.Fatalf("both sides of the split count a quorum: %s; %s; %s", state(n), state(near[0]), state(near[1]))
			}
		}
		tick := time.NewTimer(20 * time.Millisecond)
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	for _, n := range near {
		if st := n.c.Status(); !st.Quorum || !slices.Equal(st.Stable, []string{"v0", "v1"}) {
			t.Errorf("the side that heard the goodbye: %s, want a quorum of [v0 v1]", state(n))
		}
	}
}
