package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
)

// TestBroadcastQueueCountsMembers: the broadcast queue's count of members
// (delegate.numNodes, kept by memberlist's join and leave events so the
// queue never takes memberlist's node lock under its own) is memberlist's
// NumMembers, as nodes join, crash and leave.
func TestBroadcastQueueCountsMembers(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	same := func(want int) {
		t.Helper()
		// The cluster has converged: the counts agree within a gossip
		// round or two, so a short wait (a mutant fails fast).
		cctx, ccancel := slowtest.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		err := testkit.Check(cctx, func() error {
			for _, n := range tc.all() {
				got, ml := n.c.dlg.numNodes(), n.c.mlp.Load().NumMembers()
				if got != ml || got != want {
					return fmt.Errorf("%s: the queue counts %d members, memberlist %d, want %d", n.name, got, ml, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	tc.startNodes(ctx, "n", 4)
	same(4)
	crashed := tc.remove("n1")
	crashed.c.Close() // no Leave: a crash, the others mark it dead
	tc.waitConverged(ctx)
	same(3)
	leaver := tc.remove("n2")
	if err := leaver.c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	leaver.c.Close()
	tc.waitConverged(ctx)
	same(2)
	tc.start(ctx, "n4")
	tc.waitConverged(ctx)
	same(3)
}
