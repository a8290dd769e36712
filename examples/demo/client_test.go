//go:build unix

package main

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// The report's client rows fail the run for a call failed, or an outcome
// left unknown, during the graceful leave (L2) with -strict-leave (without
// it those rows are shown with their verdict but do not decide the run),
// and for a write committed twice in any case; an unknown outcome outside
// the leave (the crash, the pause) is shown but does not fail it.
func TestClientChecksJudgeTheLeave(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	unknown := fmt.Errorf("put: %w", ownership.ErrOutcomeUnknown)
	failed := errors.New("unavailable")
	for _, c := range []struct {
		name  string
		calls []clientCall
		dups  int
		want  bool // with -strict-leave
		lax   bool // without it
	}{
		{"no failure", []clientCall{{start: at(1), end: at(1.1)}, {start: at(10.5), end: at(10.6)}}, 0, true, true},
		{"unknown outcome at the crash", []clientCall{{start: at(2), end: at(3), err: unknown}}, 0, true, true},
		{"failed call before the leave", []clientCall{{start: at(5), end: at(6), err: failed}}, 0, true, true},
		{"failed call during the leave", []clientCall{{start: at(10.2), end: at(10.4), err: failed}}, 0, false, true},
		{"unknown outcome across the leave's start", []clientCall{{start: at(9.5), end: at(10.5), err: unknown}}, 0, false, true},
		{"write committed twice", nil, 1, false, false},
	} {
		p := &clientPath{calls: c.calls, leaveAt: at(10), leftAt: at(12)}
		checks := p.figures().checks(c.dups, true)
		if got := allPassed(checks); got != c.want {
			t.Errorf("%s, strict: checks %+v pass = %v, want %v", c.name, checks, got, c.want)
		}
		checks = p.figures().checks(c.dups, false)
		if got := allPassed(checks); got != c.lax {
			t.Errorf("%s, shown: checks %+v pass = %v, want %v", c.name, checks, got, c.lax)
		}
		// Shown rows still carry their verdict.
		if got, want := checks[0].OK && checks[1].OK, c.want || c.dups > 0; got != want || !checks[0].Shown {
			t.Errorf("%s, shown: L2 rows %+v, want their verdict %v, shown", c.name, checks[:2], want)
		}
	}
}

// The calls that failed during the leave are kept with their key and entry
// node, so the report can say which partitions the leave failed and why;
// failures outside the leave are not listed.
func TestClientFiguresListTheLeaveFailures(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	failed := errors.New("deadline")
	p := &clientPath{leaveAt: at(10), leftAt: at(12), calls: []clientCall{
		{entry: "node-0", key: "w1/k1", start: at(5), end: at(6), err: failed},
		{entry: "node-1", key: "w2/k2", start: at(10.1), end: at(11.1), err: failed},
		{entry: "node-3", key: "w3/k3", start: at(10.2), end: at(10.3)},
	}}
	f := p.figures()
	if len(f.leaveFailures) != 1 || f.leaveFailures[0].key != "w2/k2" || f.leaveFailures[0].entry != "node-1" || f.failedDuringLeave != 1 {
		t.Errorf("leave failures %+v (%d counted), want the one call of w2/k2 through node-1", f.leaveFailures, f.failedDuringLeave)
	}
}
