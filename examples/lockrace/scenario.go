package main

import (
	"context"
	"fmt"
	"time"

	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// staleWrite runs the pause scenario under g on key: A takes the guard
// and reads the counter; A pauses (its keepalives stop, if it has any)
// until B has taken the guard and incremented the counter; then A writes
// the value it computed before the pause. It reports whether A's write
// landed on top of B's, and A's error if it did not. B must get the guard
// within bound.
func staleWrite(ctx context.Context, st *store, g guard, key string, bound time.Duration) (landed bool, aErr error, err error) {
	if err := st.reset(ctx, []string{key}); err != nil {
		return false, nil, err
	}
	a, err := g.worker(ctx, "node-a")
	if err != nil {
		return false, nil, err
	}
	defer a.close()
	b, err := g.worker(ctx, "node-b")
	if err != nil {
		return false, nil, err
	}
	defer b.close()

	ha, err := a.lock(ctx, key)
	if err != nil {
		return false, nil, fmt.Errorf("holder A takes the guard: %w", err)
	}
	var v int64
	if err := ha.tx(ctx, func(q sqlfence.Tx) error {
		v, err = st.read(ctx, q, key)
		return err
	}); err != nil {
		return false, nil, fmt.Errorf("holder A reads: %w", err)
	}
	pause(a) // A stops here, as a process stopped by SIGSTOP or a long GC pause would
	bctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := do(bctx, b, key, func(q sqlfence.Tx) error { return st.increment(bctx, q, key, "B") }); err != nil {
		return false, nil, fmt.Errorf("holder B writes (it must get the guard within %v): %w", bound, err)
	}
	// A resumes, knowing nothing of the pause.
	aErr = ha.tx(ctx, func(q sqlfence.Tx) error { return st.write(ctx, q, key, v+1, "A") })
	if uerr := ha.unlock(ctx); aErr == nil {
		aErr = uerr // the write landed; the unlock may still fail
	}
	_, writer, err := st.last(ctx, key)
	if err != nil {
		return false, aErr, err
	}
	return writer == "A", aErr, nil
}
