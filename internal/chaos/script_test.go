package chaos

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var flagScript = flag.String("chaos.script", "", "run these episodes, in the simulator's vocabulary, instead of a random schedule")

// A scriptStep is a step of a scripted episode, in the vocabulary of the simulator's
// scripts (internal/sim/testdata), so that a fault pattern the simulator
// finds can be run here in real time:
//
//	split n0,n1|n2,n3,n4   cut n0>n1   crash n2   restart n2   drops 0.2   wait 2s
//
// Steps are separated by ";" and episodes by "/"; every episode ends with a
// heal, after which the cluster must settle with at most 3 new epochs per
// partition.
type scriptStep struct {
	verb string
	args []string
}

func parseScript(s string) ([][]scriptStep, error) {
	var out [][]scriptStep
	for ep := range strings.SplitSeq(s, "/") {
		var steps []scriptStep
		for st := range strings.SplitSeq(ep, ";") {
			f := strings.Fields(st)
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "split", "cut", "crash", "restart", "drops", "wait":
			default:
				return nil, fmt.Errorf("chaos script: unknown scriptStep %q", st)
			}
			if len(f) != 2 {
				return nil, fmt.Errorf("chaos script: %q takes one argument", st)
			}
			steps = append(steps, scriptStep{verb: f[0], args: f[1:]})
		}
		if len(steps) > 0 {
			out = append(out, steps)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("chaos script %q has no episode", s)
	}
	return out, nil
}

// runEpisode runs a scripted episode's steps; the caller heals.
func (cl *cluster) runEpisode(ctx context.Context, steps []scriptStep) string {
	t := cl.t
	var done []string
	byName := func(name string) *node {
		for _, n := range cl.all() {
			if n.name == name {
				return n
			}
		}
		t.Fatalf("chaos script: no node %q", name)
		return nil
	}
	for _, st := range steps {
		a := st.args[0]
		switch st.verb {
		case "split":
			l, r, _ := strings.Cut(a, "|")
			if err := cl.net.Partition(strings.Split(l, ","), strings.Split(r, ",")); err != nil {
				t.Fatal(err)
			}
		case "cut":
			from, to, _ := strings.Cut(a, ">")
			cl.net.Cut(from, to)
		case "crash":
			byName(a).crash()
		case "restart":
			n := byName(a)
			if n.stopped.Load() {
				cl.start(ctx, n.name, n.addr, n.gossip)
			}
		case "drops":
			p, err := strconv.ParseFloat(a, 64)
			if err != nil {
				t.Fatal(err)
			}
			if err := cl.net.Drop(p); err != nil {
				t.Fatal(err)
			}
		case "wait":
			d, err := time.ParseDuration(a)
			if err != nil {
				t.Fatal(err)
			}
			hold(ctx, d)
		}
		done = append(done, st.verb+" "+a)
	}
	// Whatever the script left crashed comes back, as the simulator's heal
	// does.
	for _, n := range cl.all() {
		if n.stopped.Load() && !slices.ContainsFunc(cl.live(), func(m *node) bool { return m.name == n.name }) {
			cl.start(ctx, n.name, n.addr, n.gossip)
		}
	}
	return "script: " + strings.Join(done, "; ")
}

// TestChaosScript runs, in real time on real memberlist and gRPC, fault
// patterns the simulator found: the reshaped split of issue 11 (defect 5)
// and a restart on the minority side (defect 4). -chaos.script runs any
// other; the simulator prints one for a failing seed.
func TestChaosScript(t *testing.T) {
	script := *flagScript
	if script == "" {
		script = "split n0,n1|n2,n3,n4; wait 7s; split n0,n1,n2|n3,n4; wait 4s" +
			" / split n0,n1|n2,n3,n4; wait 3s; crash n1; wait 1s; restart n1; wait 4s"
	}
	r := runChaos(t, runConfig{name: "script", nodes: 5, partitions: 16, clients: 4, fencing: true, seed: 7, script: script})
	r.print("violations")
	r.fail(t)
}
