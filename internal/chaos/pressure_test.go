package chaos

import (
	"context"
	"math/rand/v2"
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
