package sim

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership/gossip"
)

var (
	long     = flag.Bool("sim.long", false, "TestFigures runs the long randomized mode (100x the schedules)")
	replay   = flag.Uint64("sim.seed", 0, "replay one seed of TestRandom with a trace")
	traceOut = flag.Bool("sim.trace", false, "print the trace of a replayed seed")
)

// shortSchedules is how many schedules TestFigures runs in the test
// command: about a million simulated events, under a minute with -race on
// two cores.
const shortSchedules = 300

// configFor derives a schedule's cluster from its seed: 3 to 7 nodes, both
// kinds of authority, with and without keys.
func configFor(seed uint64) Config {
	cfg := DefaultConfig(seed)
	cfg.Nodes = 3 + int(seed%5)
	cfg.Strict = seed%2 == 0
	cfg.Keys = seed%3 == 0
	return cfg
}

// runSchedule runs one random schedule and returns the simulator.
func runSchedule(t testing.TB, cfg Config, trace *strings.Builder) *Sim {
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if trace != nil {
		s.Trace(trace)
	}
	s.RunRandom(3)
	return s
}

func report(s *Sim, cfg Config) string {
	chaos, skipped := ChaosScript(s.Faults())
	return fmt.Sprintf("seed %d (%d nodes, strict %v, keys %v): %d events\nviolations:\n  %s\nfaults:\n  %s\n"+
		"replay: go test ./internal/sim -run TestRandom -sim.seed=%d -sim.trace -v\n"+
		"in real time: go test ./internal/chaos -run TestChaosScript -v -chaos.script='%s' (left out: %v)",
		cfg.Seed, cfg.Nodes, cfg.Strict, cfg.Keys, s.Events,
		strings.Join(s.Violations(), "\n  "), strings.Join(s.Faults(), "\n  "), cfg.Seed, chaos, skipped)
}

// The chaos suite's script keeps the steps it can run and the time between
// them, episode by episode.
func TestChaosScriptFromFaults(t *testing.T) {
	got, skipped := ChaosScript([]string{
		"t=10 split n0,n1|n2,n3,n4", "t=45 split n0,n1,n2|n3,n4", "t=60 heal",
		"t=70 crash n1", "t=72 pause n2 5", "t=80 restart n1", "t=95 heal",
	})
	want := "split n0,n1|n2,n3,n4; wait 7000ms; split n0,n1,n2|n3,n4; wait 3000ms / crash n1; wait 400ms; wait 1600ms; restart n1; wait 3000ms"
	if got != want || len(skipped) != 1 || skipped[0] != "pause n2 5" {
		t.Fatalf("ChaosScript = %q, skipped %q\nwant %q", got, skipped, want)
	}
}

type runStats struct {
	schedules, events, splitBrains int
	elapsed                        time.Duration
}

// randomRuns runs n schedules from seed first and fails on the first
// violation.
func randomRuns(t *testing.T, first uint64, n int) runStats {
	var st runStats
	start := time.Now()
	for seed := first; seed < first+uint64(n); seed++ {
		cfg := configFor(seed)
		s := runSchedule(t, cfg, nil)
		st.schedules++
		st.events += int(s.Events)
		st.splitBrains += s.SplitBrains()
		if len(s.Violations()) > 0 {
			t.Fatal(report(s, cfg))
		}
	}
	st.elapsed = time.Since(start)
	return st
}

// TestRandom runs random fault schedules against the real core and checks
// S1-S4, the handler contract, convergence after every heal, the duel
// bound, claim storms and the outdated rule after every step. A failing
// seed replays exactly with -sim.seed.
func TestRandom(t *testing.T) {
	if *replay != 0 {
		cfg := configFor(*replay)
		var b strings.Builder
		s := runSchedule(t, cfg, &b)
		if *traceOut {
			t.Log("\n" + b.String())
		}
		if len(s.Violations()) > 0 {
			t.Fatal(report(s, cfg))
		}
		return
	}
	n := 50 // TestFigures runs the short batch (and -sim.long the long one)
	st := randomRuns(t, 1, n)
	t.Logf("%d schedules, %d events in %v (%.0f events/s), %d split brains", st.schedules, st.events, st.elapsed,
		float64(st.events)/st.elapsed.Seconds(), st.splitBrains)
}

// A seed replays exactly: the same seed gives the same faults, the same
// events and the same trace.
func TestReplayIsExact(t *testing.T) {
	for _, seed := range []uint64{3, 17, 42} {
		var a, b strings.Builder
		s1 := runSchedule(t, configFor(seed), &a)
		s2 := runSchedule(t, configFor(seed), &b)
		if a.String() != b.String() || s1.Events != s2.Events || s1.Now() != s2.Now() {
			t.Fatalf("seed %d ran two ways: %d and %d events", seed, s1.Events, s2.Events)
		}
		if a.Len() == 0 {
			t.Fatal("empty trace")
		}
	}
	var a, b strings.Builder
	runSchedule(t, configFor(5), &a)
	runSchedule(t, configFor(6), &b)
	if a.String() == b.String() {
		t.Fatal("two seeds ran the same way")
	}
}

// A control re-introduces one defect; the checks must catch it within
// maxSchedules schedules.
type control struct {
	name  string
	apply func(*Config)
	// want names the check that must fire: a word its violation contains.
	// A control caught by some other check proves nothing about its own.
	want string
}

var controls = []control{
	{"skip_fence", func(c *Config) { c.Knobs.SkipFence = true }, "S2"},
	{"stable_from_first_view", func(c *Config) { c.Knobs.StableFromFirstView = true }, "outdated"},
	{"claim_without_backoff", func(c *Config) { c.Knobs.NoClaimBackoff = true }, "storm"},
	{"accept_unauthenticated_gossip", func(c *Config) { c.Bugs.TrustGossip = true; c.Strict = false }, "stall"},
	{"reuse_incarnation", func(c *Config) { c.Bugs.ReuseIncarnation = true }, "S3"},
	{"resource_skips_fence", func(c *Config) { c.Bugs.NoFenceAtResource = true }, "S1"},
	{"claim_ignores_mark", func(c *Config) { c.Bugs.ClaimIgnoresMark = true; c.Strict = true }, "S4"},
	{"no_step_down", func(c *Config) { c.Knobs.NoStepDown = true }, "L4"},
	{"half_is_quorum", func(c *Config) { c.Knobs.HalfIsQuorum = true }, "two quorums"},
	{"forget_fenced_view", func(c *Config) { c.Knobs.ForgetFencedView = true }, "duel"},
	{"any_kind_as_state", func(c *Config) { c.Bugs.AnyKindAsState = true }, "crash"},
	{"graceful_by_flag", func(c *Config) { c.Bugs.GracefulByFlag = true }, "two quorums"},
	{"reach_all_members", func(c *Config) { c.Bugs.ReachAllMembers = true }, "reach storm"},
	{"reach_ignores_lag", func(c *Config) { c.Bugs.ReachIgnoresLag = true }, "self-blame"},
}

// maxSchedules bounds how long a control may survive.
const maxSchedules = 500

// caughtAfter runs schedules with the control until a violation containing
// c.want appears, and returns how many it took (0: never).
func caughtAfter(t testing.TB, c control, from uint64) (int, string) {
	for i := range maxSchedules {
		cfg := configFor(from + uint64(i))
		c.apply(&cfg)
		s := runSchedule(t, cfg, nil)
		for _, v := range s.Violations() {
			if strings.Contains(v, c.want) {
				return i + 1, v
			}
		}
	}
	return 0, ""
}

// TestFigures is the simulator's short run in the test command: random
// schedules (failing on any violation), then every negative control, each
// of which must be caught within maxSchedules schedules. It prints the
// figures:
//
//	go test ./internal/sim -run TestFigures -v
func TestFigures(t *testing.T) {
	n := shortSchedules
	if *long {
		n *= 100
	}
	st := randomRuns(t, 1_000_000, n)
	fmt.Printf("figure: sim.schedules %d\n", st.schedules)
	fmt.Printf("figure: sim.events %d\n", st.events)
	fmt.Printf("figure: sim.events_per_second %.0f\n", float64(st.events)/st.elapsed.Seconds())
	fmt.Printf("figure: sim.violations 0\n")
	fmt.Printf("figure: sim.split_brains %d\n", st.splitBrains)
	printFailoverFigures(t)
	pt := runScalePoint(t, 100, 1024)
	checkScalePoint(t, pt)
	pt.print()
	for _, c := range controls {
		n, v := caughtAfter(t, c, 1_000_000)
		if n == 0 {
			t.Errorf("control %s survived %d schedules", c.name, maxSchedules)
		} else {
			t.Logf("control %s caught by: %s", c.name, v)
		}
		fmt.Printf("figure: sim.control.%s.caught_after %d\n", c.name, n)
	}
}

// Seeds that found defects of the checker itself: the outdated rule
// measured how long a node was behind only while it served (1000034), and
// kept the start it had measured in an earlier component through the
// first ticks of a new one (1005399, from the long run), so it flagged
// nodes that had caught up within a tick of the newer membership.
func TestCheckerRegressionSeeds(t *testing.T) {
	for _, seed := range []uint64{1000034, 1005399} {
		s := runSchedule(t, configFor(seed), nil)
		if v := s.Violations(); len(v) > 0 {
			t.Errorf("seed %d: %v", seed, v)
		}
	}
}

// The check that a partition's handler calls never overlap fires on one
// overlapping call, and not on a call that follows one past its deadline.
func TestHandlerOverlapCheckFires(t *testing.T) {
	s, err := New(DefaultConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	n := s.nodes[0]
	n.call(0, "Acquire", 12)
	n.ticks += 12 // overran: the next call may start
	n.call(0, "Release", 12)
	if v := s.Violations(); len(v) != 0 {
		t.Fatalf("a call after an overrun was flagged: %v", v)
	}
	n.ticks += 3
	n.call(0, "Acquire", 12)
	if v := s.Violations(); len(v) != 1 || !strings.Contains(v[0], "handler: Acquire of p0") {
		t.Fatalf("an Acquire while the Release of 3 ticks ago runs: %v", v)
	}
}

// Issue 19, defect 1: the simulator opened every message whatever channel
// it came in on, as the shell's MergeRemoteState did, but handled every
// kind, so it could not see that the shell crashed on a claim sent as
// push/pull state. Its delegate now opens each channel's kinds only and
// does what the shell does with a state (read its register), a panic in it
// is a violation, and the adversary replays authentic messages late and on
// the wrong channel. Replays change nothing a check can see, keyed or not;
// with the shell's old open (any kind as state) the first broadcast
// replayed as state crashes a node.
func TestReplayedMessages(t *testing.T) {
	for _, keys := range []bool{false, true} {
		for _, bug := range []bool{false, true} {
			cfg := DefaultConfig(7)
			cfg.Keys = keys
			cfg.Bugs.AnyKindAsState = bug
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s.Settle()
			chans := map[gossip.Channel]int{}
			for _, m := range s.net.sniffed {
				chans[m.ch]++
			}
			if chans[gossip.Broadcast] == 0 || chans[gossip.PushPull] == 0 {
				t.Fatalf("keys %v: the adversary copied %v, want both channels", keys, chans)
			}
			for range 5 {
				s.Replay()
				s.Run(s.cfg.PushPull)
			}
			s.Settle()
			v := s.Violations()
			crashed := slices.ContainsFunc(v, func(v string) bool { return strings.Contains(v, "crash") })
			switch {
			case !bug && len(v) > 0:
				t.Fatalf("keys %v: replays caused %v", keys, v)
			case !bug:
				if ok, why := s.Converged(); !ok {
					t.Fatalf("keys %v: not converged after the replays: %s", keys, why)
				}
			case bug && !crashed:
				t.Fatalf("keys %v: with any kind as state, replays gave %v, want a crash", keys, v)
			}
		}
	}
}
