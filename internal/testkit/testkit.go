package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
)

// Ctx returns a context that ends after d scaled by slowtest.Factor, or
// when the test ends: the bound of a whole test's calls.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := slowtest.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Poll checks cond every 10 ms until it holds, or returns ctx's error
// with how busy the machine was and how late the polling ran.
func Poll(ctx context.Context, cond func() bool) error {
	lag := slowtest.Lag{Interval: 10 * time.Millisecond}
	tick := time.NewTicker(lag.Interval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (machine: %s; polling ran up to %v late)", ctx.Err(), slowtest.Describe(), lag.Max().Round(time.Millisecond))
		case now := <-tick.C:
			lag.Tick(now)
		}
	}
	return nil
}

// WaitFor is Poll for a test: it waits until cond holds and fails t with
// what ("waiting for <what>: context deadline exceeded (machine: ...)") if
// ctx ends first. Bound ctx with a deadline; like t.Fatalf, call it only
// from the test's goroutine.
func WaitFor(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	if err := Poll(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
