package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership/machine"
)

// failoverSeeds is how many clusters failoverTicks crashes a node of.
const failoverSeeds = 200

// failoverTicks forms a default cluster for each of failoverSeeds seeds,
// crashes one node once it has settled, and returns, sorted, the ticks
// until every partition is served again by its ring owner under the
// resource's mark: the failover figure with the injected clock (the
// coordinator's TestFigures measures it in seconds, over loopback).
// Handlers sometimes fail or overrun Acquire here (as node.go injects):
// those runs take a retry or an Acquire deadline more.
func failoverTicks(t testing.TB) []int {
	var out []int
	for seed := uint64(1); seed <= failoverSeeds; seed++ {
		s, err := New(DefaultConfig(seed))
		if err != nil {
			t.Fatal(err)
		}
		s.Settle()
		s.Crash(int(seed % uint64(s.cfg.Nodes)))
		start := s.now
		for !s.failedOver() {
			if int(s.now-start) > s.settleBound() {
				t.Fatalf("seed %d: no failover within %d ticks", seed, s.settleBound())
			}
			s.Step()
		}
		if v := s.Violations(); len(v) > 0 {
			t.Fatalf("seed %d: %v", seed, v)
		}
		out = append(out, int(s.now-start))
	}
	slices.Sort(out)
	return out
}

// failedOver reports whether the running nodes agree on the placement and
// every partition is served by its ring owner under the resource's mark
// (Converged without its quorum condition: a node's quorum may blink while
// the stable membership is promoted, after the failover is done).
func (s *Sim) failedOver() bool {
	var ref []string
	for _, n := range s.nodes {
		if !n.running() {
			continue
		}
		if v := n.placed(); ref == nil {
			ref = v
		} else if !slices.Equal(ref, v) {
			return false
		}
	}
	if ref == nil {
		return false
	}
	t := s.table(ref)
	for p := range uint32(s.cfg.Partitions) {
		o := s.nodeByName(t.Owner(p))
		if o == nil || !o.running() {
			return false
		}
		if ph, tok := o.m.Phase(p); ph != machine.Owned || !o.served(p) || !s.res.mark(p).Same(tok) {
			return false
		}
	}
	return true
}

// printFailoverFigures prints failoverTicks' distribution beside detection
// plus grace, for TestFigures.
func printFailoverFigures(t testing.TB) {
	ticks := failoverTicks(t)
	c := DefaultConfig(0)
	at := func(q float64) int { return ticks[int(q*float64(len(ticks)-1))] }
	fmt.Printf("figure: sim.failover.detect_max_plus_grace_ticks %d\n", c.DetectMax+c.Grace)
	fmt.Printf("figure: sim.failover.p50_ticks %d\n", at(0.5))
	fmt.Printf("figure: sim.failover.p90_ticks %d\n", at(0.9))
	fmt.Printf("figure: sim.failover.p99_ticks %d\n", at(0.99))
	fmt.Printf("figure: sim.failover.max_ticks %d\n", ticks[len(ticks)-1])
}
