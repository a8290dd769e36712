package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
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
