//go:build linux

package pressure

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
)

// steadyWindow is how long a steady-state figure watches a settled
// cluster; failoverNodes is the cluster size of the steady and failover
// figures.
const (
	steadyWindow  = 12 * time.Second
	failoverNodes = 5
)

// loadedLoops is the busy machine of the figures: two busy loops per core.
const loadedLoops = 2

// steadyResult is what the nodes of a settled cluster did in a window.
type steadyResult struct {
	quorumLosses int    // a node's quorum going from held to lost, as polled every 20 ms
	epochs       uint64 // fence epochs minted over every partition
	window       time.Duration
}

func (r steadyResult) perMinute(n uint64) float64 { return float64(n) / r.window.Minutes() }

// lanTimings gives cfg (a local node of the harness) the LAN preset's
// timings and memberlist settings, keeping its transport.
func lanTimings(cfg *coordinator.Config) {
	lan := coordinator.LANConfig()
	ml := *lan.Memberlist
	ml.Transport = cfg.Memberlist.Transport
	cfg.Memberlist = &ml
	cfg.TickInterval, cfg.StepDown, cfg.Grace = lan.TickInterval, lan.StepDown, lan.Grace
	cfg.HandoffTimeout, cfg.AcquireTimeout, cfg.ReleaseTimeout = lan.HandoffTimeout, lan.AcquireTimeout, lan.ReleaseTimeout
	cfg.RetryInterval, cfg.MaxRetryInterval, cfg.RejoinInterval = lan.RetryInterval, lan.MaxRetryInterval, lan.RejoinInterval
	cfg.StableAfter, cfg.LeaveTimeout = lan.StableAfter, lan.LeaveTimeout
}

// steady starts failoverNodes nodes on preset ("lan" or "local"), waits
// until they have settled, then watches them for steadyWindow, with
// loadedLoops busy loops per core running meanwhile if loaded. The loops
// end with the window (and by themselves soon after if this test dies).
func steady(t *testing.T, preset string, loaded bool) steadyResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fence, err := ownership.NewMemoryFence(gatePartitions)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tenuretest.Config{Nodes: failoverNodes, Partitions: gatePartitions, Fence: fence}
	if preset == "lan" {
		cfg.Tweak = lanTimings
	}
	cl, err := tenuretest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	epochs := func() (sum uint64) {
		for p := range uint32(gatePartitions) {
			sum += fence.Current(p).Epoch
		}
		return sum
	}
	if loaded {
		l, err := Busy(loadedLoops, steadyWindow+5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Stop()
	}
	r := steadyResult{}
	before := epochs()
	had := map[string]bool{}
	for _, n := range cl.Live() {
		had[n] = true
	}
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < steadyWindow {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		for _, n := range cl.Live() {
			q := cl.Node(n).Status().Quorum
			if had[n] && !q {
				r.quorumLosses++
			}
			had[n] = q
		}
	}
	r.window = time.Since(start)
	r.epochs = epochs() - before
	return r
}

// failover crashes one node of a settled cluster and returns the time
// until the others converged, with loadedLoops busy loops per core
// running from just before the crash if loaded.
func failover(t *testing.T, loaded bool) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := tenuretest.Start(ctx, tenuretest.Config{Nodes: failoverNodes, Partitions: gatePartitions})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if loaded {
		l, err := Busy(loadedLoops, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Stop()
	}
	start := time.Now()
	if err := cl.Crash("node-1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// printSteadyFigures prints the steady-state figures of both presets,
// quiet and loaded, and the failover figures.
func printSteadyFigures(t *testing.T) {
	for _, preset := range []string{"local", "lan"} {
		for _, cond := range []struct {
			name   string
			loaded bool
		}{{"quiet", false}, {"loaded", true}} {
			r := steady(t, preset, cond.loaded)
			fmt.Printf("figure: pressure.%s.%s.quorum_losses_per_minute %.1f\n", preset, cond.name, r.perMinute(uint64(r.quorumLosses)))
			fmt.Printf("figure: pressure.%s.%s.epochs_per_minute %.1f\n", preset, cond.name, r.perMinute(r.epochs))
		}
	}
	quiet := failover(t, false)
	loaded := failover(t, true)
	fmt.Printf("figure: pressure.quiet.failover_seconds %.2f\n", quiet.Seconds())
	fmt.Printf("figure: pressure.loaded.failover_seconds %.2f\n", loaded.Seconds())
	fmt.Printf("figure: pressure.loaded.failover_over_quiet %.2f\n", loaded.Seconds()/quiet.Seconds())
}
