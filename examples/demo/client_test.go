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
// left unknown, during the graceful leave (L2), and for a write committed
// twice; an unknown outcome outside the leave (the crash, the pause) is
// shown but does not fail it.
func TestClientChecksJudgeTheLeave(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	unknown := fmt.Errorf("put: %w", ownership.ErrOutcomeUnknown)
	failed := errors.New("unavailable")
	for _, c := range []struct {
		name  string
		calls []clientCall
		dups  int
		want  bool
	}{
		{"no failure", []clientCall{{start: at(1), end: at(1.1)}, {start: at(10.5), end: at(10.6)}}, 0, true},
		{"unknown outcome at the crash", []clientCall{{start: at(2), end: at(3), err: unknown}}, 0, true},
		{"failed call before the leave", []clientCall{{start: at(5), end: at(6), err: failed}}, 0, true},
		{"failed call during the leave", []clientCall{{start: at(10.2), end: at(10.4), err: failed}}, 0, false},
		{"unknown outcome across the leave's start", []clientCall{{start: at(9.5), end: at(10.5), err: unknown}}, 0, false},
		{"write committed twice", nil, 1, false},
	} {
		p := &clientPath{calls: c.calls, leaveAt: at(10), leftAt: at(12)}
		checks := p.figures().checks(c.dups)
		if got := allPassed(checks); got != c.want {
			t.Errorf("%s: checks %+v pass = %v, want %v", c.name, checks, got, c.want)
		}
	}
}
