package testkit

import (
	"context"
	"errors"
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
	return Check(ctx, func() error {
		if cond() {
			return nil
		}
		return errPending
	})
}

// errPending is Poll's condition not holding yet: it says nothing more.
var errPending = errors.New("pending")

// Check is Poll for a condition that says why it does not hold: it calls
// check every 10 ms until it returns nil, or returns ctx's error with
// check's last error, how busy the machine was and how late the polling ran.
func Check(ctx context.Context, check func() error) error {
	lag := slowtest.Lag{Interval: 10 * time.Millisecond}
	tick := time.NewTicker(lag.Interval)
	defer tick.Stop()
	for {
		last := check()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			why := ""
			if last != errPending {
				why = fmt.Sprintf(", last: %v", last)
			}
			return fmt.Errorf("%w%s (machine: %s; polling ran up to %v late)", ctx.Err(), why, slowtest.Describe(), lag.Max().Round(time.Millisecond))
		case now := <-tick.C:
			lag.Tick(now)
		}
	}
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
