package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
)

// faultCounts is what a run through the faults saw.
type faultCounts struct {
	report      worker.Report
	pausedStale int64 // commits of the paused node the fence refused
	blocked     int32 // batches the paused node had in hand
	leaverStale int64 // commits of the leaving node refused
}

// runFaults consumes a log on 3 nodes through a pause past the lease in
// the middle of a batch, a crash and restart, and a graceful leave, with
// events produced between them.
func runFaults(t *testing.T, ctx context.Context, b backend, parts, batch int) faultCounts {
	t.Helper()
	l := newEventLog(t, ctx, b, parts, batch, 16)
	cs := startConsumers(t, ctx, l, 3, worker.Config{Logger: testLogger(t), MaxConcurrent: 8, PollInterval: 10 * time.Millisecond, MaxPollInterval: 100 * time.Millisecond})
	cl := cs.Cl
	t0 := time.Now()
	step := func(what string, err error) {
		t.Helper()
		t.Logf("%v %s", time.Since(t0).Round(time.Millisecond), what)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	step("produce", l.produce(ctx, 10))
	l.waitConsumed(ctx, t)
	step("consumed", nil)

	// Pause node-2, its handler frozen with batches read but not committed.
	h := cs.Holds["node-2"]
	h.Freeze()
	step("pause", cl.Pause("node-2"))
	step("produce", l.produce(ctx, 10))
	tenuretest.WaitFor(ctx, t, "a batch in hand on the paused node", func() bool { return h.Blocked.Load() >= 1 })
	step("fail over", cl.WaitConverged(ctx, "node-0", "node-1"))
	l.waitConsumed(ctx, t)
	step("consumed", nil)
	var fc faultCounts
	rt2 := cs.RT("node-2")
	before := rt2.Stats().Stale
	fc.blocked = h.Blocked.Load()
	h.Thaw() // the batches in hand commit under the old leases
	tenuretest.WaitFor(ctx, t, "the paused node's commits refused", func() bool {
		return rt2.Stats().Stale-before >= int64(fc.blocked)
	})
	fc.pausedStale = rt2.Stats().Stale - before
	step("resume", cl.Resume("node-2"))
	step("converge after resume", cl.WaitConverged(ctx))
	step("produce", l.produce(ctx, 10))
	l.waitConsumed(ctx, t)
	step("consumed", nil)

	// A crash and a restart.
	step("crash", cl.Crash("node-1"))
	step("produce", l.produce(ctx, 10))
	step("converge after crash", cl.WaitConverged(ctx))
	l.waitConsumed(ctx, t)
	step("consumed", nil)
	step("restart", cl.Restart(ctx, "node-1"))
	step("converge after restart", cl.WaitConverged(ctx))
	step("produce", l.produce(ctx, 10))

	// A graceful leave while events flow.
	rt0 := cs.RT("node-0")
	step("leave", cl.Leave(ctx, "node-0"))
	fc.leaverStale = rt0.Stats().Stale
	step("produce", l.produce(ctx, 10))
	step("converge after leave", cl.WaitConverged(ctx))
	l.waitConsumed(ctx, t)
	step("consumed", nil)
	fc.report = l.check(ctx, t)
	return fc
}

// Every event is applied exactly once and in order, through a pause past
// the lease mid-batch (whose commits the fence refuses, each reported), a
// crash and a graceful leave, on SQLite and PostgreSQL.
func TestExactlyOnceThroughFaults(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			fc := runFaults(t, ctx, b, 8, 4)
			if err := fc.report.Err(); err != nil {
				t.Error(err)
			}
			if want := 8 * 60; fc.report.Produced != want || fc.report.Applied != want {
				t.Errorf("produced %d, applied %d; want %d each", fc.report.Produced, fc.report.Applied, want)
			}
			// Each batch in hand is refused; a batch read as the pause
			// began may be refused too.
			if fc.pausedStale < int64(fc.blocked) || fc.blocked == 0 {
				t.Errorf("paused node: %d batches in hand, %d commits refused; want at least as many refused, and not 0", fc.blocked, fc.pausedStale)
			}
			// The leaving node drains: no commit of it is refused (L2).
			if fc.leaverStale != 0 {
				t.Errorf("the leaving node had %d commits refused, want 0: a graceful leave drains the batches in hand", fc.leaverStale)
			}
		})
	}
}

// Check catches a duplicate, a skipped event, an application out of order
// and one of an unknown event.
func TestCheckNegativeControl(t *testing.T) {
	produced := []worker.Record{{0, "0"}, {0, "1"}, {0, "2"}, {1, "0"}, {1, "1"}}
	good := []worker.Record{{0, "0"}, {1, "0"}, {0, "1"}, {1, "1"}, {0, "2"}}
	if r := worker.Check(produced, good); r.Err() != nil {
		t.Fatalf("a correct run: %v", r.Err())
	}
	for _, c := range []struct {
		name    string
		applied []worker.Record
		want    func(worker.Report) int
	}{
		{"duplicate", []worker.Record{{0, "0"}, {1, "0"}, {0, "1"}, {0, "1"}, {1, "1"}, {0, "2"}}, func(r worker.Report) int { return r.Duplicates }},
		{"skipped", []worker.Record{{0, "0"}, {1, "0"}, {1, "1"}, {0, "2"}}, func(r worker.Report) int { return r.Gaps }},
		{"out of order", []worker.Record{{0, "1"}, {0, "0"}, {1, "0"}, {1, "1"}, {0, "2"}}, func(r worker.Report) int { return r.OutOfOrder }},
		{"unknown", []worker.Record{{0, "0"}, {1, "0"}, {0, "1"}, {1, "1"}, {0, "2"}, {1, "7"}}, func(r worker.Report) int { return r.Unknown }},
	} {
		r := worker.Check(produced, c.applied)
		if c.want(r) != 1 || r.Err() == nil {
			t.Errorf("%s: report %+v, want 1 of its kind and an error", c.name, r)
		}
	}
}

// testLogger logs the workers' warnings and refusals to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
