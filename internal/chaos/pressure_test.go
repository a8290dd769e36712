package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/pressure"
)

// The pressure run's bounds: the child is paused for pressurePauses, with
// pressureLoops busy loops per core running meanwhile (they end by
// themselves after pressureLoad, and are stopped with the pauses).
const (
	pressurePauses = 8 * time.Second
	pressureLoops  = 2
	pressureLoad   = 20 * time.Second
)

// runPressure runs the SIGSTOP cluster under CPU pressure (issue 20): a
// busy machine, pressureLoops busy loops per core, and meanwhile
// micro-pauses of the child, SIGSTOP and SIGCONT of 50-500 ms at random
// (seeded), like a collector's stop-the-world pauses; then the child must
// write again, the nodes converge, and the history passes the same checks
// as every run. A pause may catch the child holding the SQLite write lock:
// the others wait for it meanwhile, as they would for a paused process.
func runPressure(t *testing.T, seed uint64) result {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := startSigCluster(ctx, t, seed)
	load, err := pressure.Busy(pressureLoops, pressureLoad)
	if err != nil {
		t.Fatal(err)
	}
	defer load.Stop()
	pauses, err := pressure.Pauses(ctx, s.pid, pressure.PauseConfig{For: pressurePauses, Rand: rand.New(rand.NewPCG(seed, 0x9a05e))})
	load.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(pauses) == 0 {
		t.Fatal("no pause was made")
	}
	var paused time.Duration
	for _, p := range pauses {
		paused += p.Continued.Sub(p.Stopped)
	}
	t.Logf("pressure: %d busy loops for the pauses; child %s (pid %d) paused %d times, %v in all",
		load.Loops(), childName, s.pid, len(pauses), paused.Round(time.Millisecond))
	// Live again: the child writes after its last pause.
	after := s.childStats(OK)
	if !waitFor(ctx, 20*time.Second, func() bool { return s.childStats(OK) > after }) {
		t.Errorf("the child made no write after its pauses (%d before); stderr:\n%s", after, s.stderr.String())
	}
	return s.finish(ctx, "pressure", len(pauses)+1)
}

// The throttled run's bounds: the child is held to throttlePercent of one
// core for throttleFor.
const (
	throttlePercent = 10
	throttleFor     = 10 * time.Second
)

// throttleWatch is what the partitions did while the child was throttled.
type throttleWatch struct {
	owned   int // partitions the child held when the throttle began
	taken   int // of those, fenced by another node when it ended
	changes int // changes of a partition's fence mark seen, over all partitions
	duels   int // partitions whose mark went back to an owner it had left
	writes  int // the child's writes applied meanwhile
	stale   int // the child's writes refused as stale meanwhile
}

// observe adds one sample of the partitions' fence marks (owner names,
// "" where unread) to seen, each partition's owners in order, counting
// the changes and the duels: a mark back at an owner it had left.
func (w *throttleWatch) observe(seen [][]string, marks []string) {
	for p, o := range marks {
		if last := seen[p][len(seen[p])-1]; o != "" && o != last {
			w.changes++
			if slices.Contains(seen[p], o) {
				w.duels++
			}
			seen[p] = append(seen[p], o)
		}
	}
}

// victim says in a word what the throttled child did.
func (w throttleWatch) victim() string {
	switch {
	case w.duels > 0:
		return "duel"
	case w.taken == 0 && w.writes > 0:
		return "kept_serving"
	case w.taken == 0:
		return "held_without_writing"
	case w.taken == w.owned:
		return "handed_over"
	default:
		return "lost_some"
	}
}

// runThrottled runs the SIGSTOP cluster with the child held to
// throttlePercent of a core (a cgroup CPU quota: what a Kubernetes CPU
// limit does to a container) for throttleFor; then the quota ends, the
// nodes converge, and the history passes the same checks as every run. It
// prints what the child did: pressure.throttled.victim (kept_serving,
// handed_over, lost_some, held_without_writing, or duel: a partition's
// mark went back to an owner it had left). It fails, never skips, where
// the machine can't make the quota (no cpu controller, or not root).
func runThrottled(t *testing.T, seed uint64) result {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := startSigCluster(ctx, t, seed)
	th, err := pressure.NewThrottle(throttlePercent)
	if err != nil {
		t.Fatalf("a throttled node needs a CPU quota: %v", err)
	}
	defer th.Close()
	marks := func() []string {
		out := make([]string, sigPartitions)
		for p := range uint32(sigPartitions) {
			if m, err := s.res.mark(ctx, p); err == nil {
				out[p] = m.Owner
			}
		}
		return out
	}
	first := marks()
	w := throttleWatch{writes: -s.childStats(OK), stale: -s.childStats(Stale)}
	for _, o := range first {
		if o == childName {
			w.owned++
		}
	}
	if err := th.Add(s.pid); err != nil {
		t.Fatal(err)
	}
	seen := make([][]string, sigPartitions) // each partition's owners, in order
	for p, o := range first {
		seen[p] = []string{o}
	}
	sample := time.NewTicker(100 * time.Millisecond)
	defer sample.Stop()
	for end := time.Now().Add(throttleFor); time.Now().Before(end) && ctx.Err() == nil; {
		select {
		case <-sample.C:
		case <-ctx.Done():
		}
		w.observe(seen, marks())
	}
	st, _ := th.Stat()
	if err := th.Close(); err != nil {
		t.Fatal(err)
	}
	w.writes += s.childStats(OK)
	w.stale += s.childStats(Stale)
	for p, o := range first {
		if o == childName && seen[p][len(seen[p])-1] != childName {
			w.taken++
		}
	}
	t.Logf("throttled: child %s (pid %d) at %d%% of a core for %v (throttled in %d of %d periods): %+v",
		childName, s.pid, throttlePercent, throttleFor, st.Throttled, st.Periods, w)
	fmt.Printf("figure: pressure.throttled.victim %s\n", w.victim())
	fmt.Printf("figure: pressure.throttled.victim_partitions_taken %d\n", w.taken)
	fmt.Printf("figure: pressure.throttled.victim_writes_per_second %.1f\n", float64(w.writes)/throttleFor.Seconds())
	fmt.Printf("figure: pressure.throttled.owner_changes %d\n", w.changes)
	r := s.finish(ctx, "throttled", 1)
	if w.duels > 0 {
		r.violations = append(r.violations, fmt.Sprintf("duel: %d partitions went back to an owner they had left while the child was throttled", w.duels))
	}
	return r
}
