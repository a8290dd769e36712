package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
)

// TestFigures prints the coordinator's figures on the local preset, and
// the scale figures of a 10-node, 271-partition cluster (scaleRun):
//
//	go test ./coordinator -run TestFigures -v
func TestFigures(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)

	// The bytes of a push/pull state, quiet (the register's digest) and at
	// a join (the whole register), issue 22.
	printStateFigures(t)

	// converge: 5 nodes start and join; every partition owned and fenced.
	start := time.Now()
	tc.startNodes(ctx, "f", 5)
	converge := time.Since(start)
	nodes, began := tc.all(), start

	// detect and failover: crash one node. detect is memberlist's death
	// detection: until the last survivor drops the node from its table.
	// failover is until every partition is re-owned and fenced.
	var subs []<-chan Event
	for _, n := range tc.all() {
		if n.name != "f3" {
			ch, unsubscribe := n.c.Subscribe(256)
			defer unsubscribe()
			subs = append(subs, ch)
		}
	}
	victim := tc.remove("f3")
	start = time.Now()
	victim.c.Close()
	var detect time.Duration
	for _, events := range subs {
		for seen := false; !seen; {
			select {
			case e := <-events:
				seen = e.Kind == EventMemberLeft && e.Node == "f3"
			case <-ctx.Done():
				t.Fatal("crash never detected")
			}
		}
		detect = max(detect, time.Since(start))
	}
	tc.waitConverged(ctx)
	failover := time.Since(start)

	// handoff: a graceful leave under continuous writes.
	handoff, w := gracefulLeave(ctx, t, tc, "f1")
	rejected := w.rejected.Load()

	// failover's target: detection, the grace period, and a quarter of a
	// second to claim, fence and acquire. Figures are not asserted; the
	// comparison is printed beside them.
	cfg := LocalConfig()
	target := detect + cfg.Grace + 250*time.Millisecond
	fmt.Printf("figure: converge.seconds %.3f\n", converge.Seconds())
	fmt.Printf("figure: detect.seconds %.3f\n", detect.Seconds())
	fmt.Printf("figure: failover.seconds %.3f\n", failover.Seconds())
	fmt.Printf("figure: failover.target_seconds %.3f\n", target.Seconds())
	fmt.Printf("figure: failover.within_target %v\n", failover <= target)
	fmt.Printf("figure: handoff.seconds %.3f\n", handoff.Seconds())
	fmt.Printf("figure: handoff.rejected_writes %d\n", rejected)
	// The reach check's cost over the whole run (start, crash, leave): its
	// pings, per node per second (issue 22; the 50-node figure is
	// TestScale50x271Converges's).
	var pings uint64
	for _, n := range nodes {
		pings += counterValue(n.c.metrics.reachPings)
	}
	fmt.Printf("figure: reach.5.pings_per_node_per_second %.2f\n", float64(pings)/float64(len(nodes))/time.Since(began).Seconds())
	if rejected != 0 {
		t.Errorf("graceful leave rejected %d writes, want 0", rejected)
	}
	// The short scale run, 10 nodes x 271 (figure: scale.10x271.*), is
	// TestScale10x271, built without the race detector (scale50_test.go).
	statusFigures(t)
}
