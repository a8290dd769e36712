//go:build unix

package pressure

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// Busy starts one loop per core per perCore; the loops spin (they use CPU)
// and end by themselves once their time is up, not before.
func TestBusyLoopsSpinAndEndByThemselves(t *testing.T) {
	const d = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	l, err := Busy(1, d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop()
	if l.Loops() != runtime.NumCPU() {
		t.Errorf("%d loops, want one per core (%d)", l.Loops(), runtime.NumCPU())
	}
	if err := l.Wait(ctx); err != nil {
		t.Fatalf("the loops did not end by themselves: %v", err)
	}
	took := time.Since(start)
	for _, c := range l.cmds {
		if !c.ProcessState.Success() {
			t.Errorf("a loop ended with %v; want it to end by itself", c.ProcessState)
		}
	}
	// A loop that slept instead would use a few milliseconds.
	if cpu, want := l.CPU(), time.Duration(l.Loops())*20*time.Millisecond; cpu < want {
		t.Errorf("the loops used %v of CPU in %v; want at least %v: they should spin", cpu, took, want)
	}
	if took < d {
		t.Errorf("the loops ended after %v, before their %v", took, d)
	}
}

// Stop ends the loops before their time; bad sizes are refused.
func TestBusyStopAndBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Busy(1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	l.Stop()
	l.Stop()
	if err := l.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range l.cmds {
		if c.ProcessState.Success() {
			t.Errorf("a loop of a minute ended by itself before Stop")
		}
	}
	for _, c := range []struct {
		perCore int
		d       time.Duration
	}{{0, time.Second}, {MaxLoopsPerCore + 1, time.Second}, {1, 0}, {1, MaxDuration + 1}} {
		if _, err := Busy(c.perCore, c.d); err == nil {
			t.Errorf("Busy(%d, %v) succeeded", c.perCore, c.d)
		}
	}
}
