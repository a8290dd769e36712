package coordinator

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
)

// Issue 20: under load a leaving node's gossip reached the new owners late
// (its releases, and its metadata saying it leaves, a second or more after
// it sent them), and its partitions stayed unowned meanwhile, so calls
// failed during a graceful leave. The leaving node pushes both to the new
// owners itself (push/pull over TCP): a leaver whose gossip never leaves
// it (muted: its packets are dropped, its streams pass) still hands every
// partition off before its Leave returns. Before the push, its successors
// never heard of the leave: the handoff waited HandoffTimeout in vain.
func TestLeaveHandsOffWithoutItsGossip(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, func(c *Config) {
		ml := *c.Memberlist
		ml.PushPullInterval = time.Hour // no periodic push/pull brings the leave instead
		c.Memberlist = &ml
	})
	tc.startNodes(ctx, "g", 4)
	leaver := tc.node("g2")
	var held []uint32
	for p := range uint32(testPartitions) {
		if leaver.c.leases.lookup(p) != nil {
			held = append(held, p)
		}
	}
	if len(held) == 0 {
		t.Fatal("g2 holds nothing to hand off")
	}
	tc.remove("g2")
	fn.Mute("g2")
	if err := leaver.c.Leave(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	for _, p := range held {
		holder := ""
		for _, n := range tc.all() {
			if n.c.leases.lookup(p) != nil {
				holder = n.name
			}
		}
		if holder == "" {
			t.Errorf("p%d: g2 handed it off, but when its Leave returned nobody held it", p)
		}
	}
	tc.waitConverged(ctx)
}

// A graceful leave's goodbye (its metadata saying Gone) went out only by
// gossip, a few transmits which may all reach members lately lost to a
// split; CI once saw both members of a split's near side miss it and count
// the leave as a crash (TestLeaveDuringSplitGivesOnlyOneSideAQuorum). The
// leaver now sends the goodbye to each live member over a stream too: a
// leaver whose packets are all dropped still has its leave counted as
// graceful, and the others drop it from their stable membership at once.
// Before, they counted a crash and kept it until a promotion (StableAfter,
// here five minutes).
func TestGoodbyeIsHeardWithoutGossip(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, func(c *Config) {
		ml := *c.Memberlist
		ml.PushPullInterval = time.Hour // no periodic push/pull brings the goodbye instead
		// The muted leaver can't refute a suspicion: one probe whose TCP
		// fallback is late on a busy machine must not have it declared
		// dead (a crash) before its goodbye arrives.
		ml.SuspicionMult = 10
		c.Memberlist = &ml
		c.StableAfter = 5 * time.Minute // no promotion drops the leaver instead
	})
	tc.startNodes(ctx, "b", 4)
	leaver := tc.remove("b3")
	fn.Mute("b3")
	if err := leaver.c.Leave(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	// Detection of the closed leaver takes a few probe rounds; a promotion
	// is minutes away.
	wctx, wcancel := slowtest.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	testkit.WaitFor(wctx, t, "the others to drop b3 from their stable membership", func() bool {
		for _, n := range tc.all() {
			if slices.Contains(n.c.Status().Stable, "b3") {
				return false
			}
		}
		return true
	})
	for _, n := range tc.all() {
		if st := n.c.Status(); !st.Quorum {
			t.Errorf("%s: no quorum after a graceful leave; stable %v", n.name, st.Stable)
		}
	}
}
