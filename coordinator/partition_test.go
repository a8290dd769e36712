package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// faultCluster is a testCluster whose gossip runs over a faultnet.Network.
// tweak, if not nil, adjusts every node's Config first.
func faultCluster(t *testing.T, tweak func(*Config)) (*testCluster, *faultnet.Network) {
	fn := faultnet.New(faultnet.WithSeed(1))
	tc := newTestCluster(t, func(c *Config) {
		if tweak != nil {
			tweak(c)
		}
		tr, err := fn.Transport(c.Name, faultnet.TransportConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ml := *c.Memberlist
		ml.Transport = tr
		c.Memberlist = &ml
	})
	return tc, fn
}

func names(nodes []*testNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.name)
	}
	return out
}

// A 3|2 split: the minority loses its quorum and revokes every lease within
// StepDown; the majority re-owns and fences everything. After the heal the
// sides merge through the periodic rejoin, and every partition ends with
// exactly one owner without a fencing duel.
func TestPartitionMinorityStepsDownAndHealMerges(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, nil)
	tc.startNodes(ctx, "p", 5)
	var major, minor []*testNode
	for _, n := range tc.all() {
		if n.name < "p3" {
			major = append(major, n)
		} else {
			minor = append(minor, n)
		}
	}
	// Writes go on through the split: a majority owner whose lease a
	// minority claim fenced out during the detection spread learns it from
	// its first rejected write.
	w := &writer{tc: tc}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(wctx, 9)
	}()
	defer func() { stop(); <-done }()
	if err := fn.Partition(names(major), names(minor)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "the minority to step down", func() bool {
		for _, n := range minor {
			if n.c.ownedCount() != 0 {
				return false
			}
		}
		return true
	})
	tc.waitConvergedAmong(ctx, major)

	epochs := make([]uint64, testPartitions)
	for p := range testPartitions {
		epochs[p] = tc.fence.Current(uint32(p)).Epoch
	}
	fn.Heal()
	tc.waitConverged(ctx)
	// No duel: settling after the heal moved each partition at most a few
	// times (back to a minority node and, rarely, once more), not a
	// ping-pong of fences.
	for p := range testPartitions {
		if d := tc.fence.Current(uint32(p)).Epoch - epochs[p]; d > 3 {
			t.Errorf("partition %d took %d new epochs to settle after the heal", p, d)
		}
	}
}
