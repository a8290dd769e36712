//go:build unix

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/transport"
)

// clientPath is what the writers saw of the faults: every Put's entry
// node, start, end and outcome, judged at the end against the windows of
// the pause and the graceful leave.
type clientPath struct {
	mu    sync.Mutex
	calls []clientCall

	paused          string // the node stopped with SIGSTOP
	stopAt, contAt  time.Time
	leaveAt, leftAt time.Time
}

type clientCall struct {
	entry, key string
	start, end time.Time
	err        error
}

func (c *clientPath) add(entry, key string, start time.Time, err error) {
	c.mu.Lock()
	c.calls = append(c.calls, clientCall{entry: entry, key: key, start: start, end: time.Now(), err: err})
	c.mu.Unlock()
}

// window records a fault's start or end.
func (c *clientPath) window(set func(*clientPath)) {
	c.mu.Lock()
	set(c)
	c.mu.Unlock()
}

// clientFigures is what the writers saw.
type clientFigures struct {
	maxWaitAfterStop    time.Duration // longest answer after the SIGSTOP, calls entering elsewhere
	failedDuringLeave   int
	unknownDuringLeave  int // of failedDuringLeave, those whose outcome is unknown
	outcomeUnknown, all int
	// leaveFailures are the calls that failed during the leave, so a
	// failed L2 row says which keys, through which node, when and why.
	leaveFailures []clientCall
	leaveAt       time.Time
}

func (c *clientPath) figures() clientFigures {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := clientFigures{all: len(c.calls), leaveAt: c.leaveAt}
	for _, k := range c.calls {
		if k.entry != c.paused && k.end.After(c.stopAt) && k.start.Before(c.contAt) {
			f.maxWaitAfterStop = max(f.maxWaitAfterStop, k.end.Sub(latest(k.start, c.stopAt)))
		}
		if k.err == nil {
			continue
		}
		unknown := transport.IsOutcomeUnknown(k.err)
		if unknown {
			f.outcomeUnknown++
		}
		if k.end.After(c.leaveAt) && k.start.Before(c.leftAt) {
			f.failedDuringLeave++
			f.leaveFailures = append(f.leaveFailures, k)
			if unknown {
				f.unknownDuringLeave++
			}
		}
	}
	return f
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// print writes the client lines of the report; partition gives a key's
// partition.
func (f clientFigures) print(takeover time.Duration, duplicates int, partition func(string) uint32) {
	fmt.Printf("        clients: longest wait after the SIGSTOP %.2fs (takeover %.2fs; calls entering through the stopped node not counted), "+
		"%d calls failed during the graceful leave, %d writes committed twice, %d unknown outcomes (of %d writes)\n",
		f.maxWaitAfterStop.Seconds(), takeover.Seconds(), f.failedDuringLeave, duplicates, f.outcomeUnknown, f.all)
	for _, k := range f.leaveFailures {
		fmt.Printf("        failed during the leave: %s (p%d) through %s, sent %+.3fs after the leave began, failed after %.3fs: %v\n",
			k.key, partition(k.key), k.entry, k.start.Sub(f.leaveAt).Seconds(), k.end.Sub(k.start).Seconds(), k.err)
	}
	fmt.Printf("figure: client.max_wait_after_sigstop_seconds %.3f\n", f.maxWaitAfterStop.Seconds())
	fmt.Printf("figure: client.failed_calls_during_leave %d\n", f.failedDuringLeave)
	fmt.Printf("figure: client.outcome_unknown_during_leave %d\n", f.unknownDuringLeave)
	fmt.Printf("figure: client.duplicate_commits %d\n", duplicates)
	fmt.Printf("figure: client.outcome_unknown %d\n", f.outcomeUnknown)
}

// checks are the report's rows for what the writers saw. A graceful leave
// should fail no call and leave no outcome unknown (L2); with strict
// (-strict-leave, the default) those rows fail the run, otherwise they are
// shown with their verdict and do not decide it. A crash and a
// pause may leave outcomes unknown (the client can't tell whether a write
// sent to a killed or stopped node landed), so the whole run's count is
// shown, not judged; a write committed twice is a failure wherever it
// happens.
func (f clientFigures) checks(duplicates int, strict bool) []check {
	return []check{
		{Name: "calls failed during the graceful leave (L2)", Value: fmt.Sprint(f.failedDuringLeave), OK: f.failedDuringLeave == 0, Shown: !strict},
		{Name: "unknown outcomes during the graceful leave (L2)", Value: fmt.Sprint(f.unknownDuringLeave), OK: f.unknownDuringLeave == 0, Shown: !strict},
		{Name: "writes committed twice", Value: fmt.Sprint(duplicates), OK: duplicates == 0},
		{Name: "unknown outcomes in the whole run (the crash and the pause may leave some)", Value: fmt.Sprintf("%d of %d writes", f.outcomeUnknown, f.all), OK: true},
	}
}

// duplicates counts this run's writes committed more than once, from the
// write log.
func (d *demo) duplicates(ctx context.Context) (int, error) {
	db, err := kvnode.OpenDB(d.sqlitePath(), d.cfg.dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	_, dups, err := kvnode.CountDuplicates(ctx, db, d.runID+"/")
	return dups, err
}
