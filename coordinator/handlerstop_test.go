package coordinator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/tenure-go/tenure/internal/leakcheck"
	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// stopFromHandler starts a lone coordinator whose Handler runs stop on it
// from its first Acquire (inRelease false) or its first Release of a live
// lease (inRelease true; the test resigns partition 0 to cause one), and
// checks that stop returns within bound, that Close from outside then
// returns within bound too (the close finished), and that no goroutine is
// left. Not parallel: it counts
// every goroutine of the process.
func stopFromHandler(t *testing.T, name string, inRelease bool, stop func(context.Context, *Coordinator) error) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	var c *Coordinator
	ready := make(chan struct{})
	stopped := make(chan error, 1)
	var once atomic.Bool
	call := func(ctx context.Context, l *ownership.Lease) error {
		<-ready
		if !once.CompareAndSwap(false, true) {
			return nil // the first call stops the coordinator
		}
		stopped <- stop(ctx, c)
		return nil
	}
	cfg := lifeConfig(name)
	if inRelease {
		cfg.Handler = HandlerFuncs{ReleaseFunc: func(ctx context.Context, l *ownership.Lease) error {
			if l.Err() != nil {
				return nil // a cleanup after the close: not the call under test
			}
			return call(ctx, l)
		}}
	} else {
		cfg.Handler = HandlerFuncs{AcquireFunc: call}
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if inRelease {
		testkit.WaitFor(ctx, t, "a lease on p0", func() bool {
			l, _ := c.LeaseOfPartition(0)
			return l != nil
		})
		if err := c.Resign(ctx, 0); err != nil {
			t.Fatalf("Resign(0): %v", err)
		}
	}
	bctx, bcancel := within(ctx)
	defer bcancel()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("called from the handler: %v", err)
		}
	case <-bctx.Done():
		t.Fatalf("called from the handler, it did not return within %v: it waits for its caller", bound)
	}
	closeWithin(t, c) // the close the handler began finishes
	if err := c.Leave(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Leave after the close returned %v, want ErrClosed", err)
	}
	if err := leakcheck.Find(); err != nil {
		t.Fatal(err)
	}
}

// A Handler may close its coordinator from Acquire: Close does not wait
// for the call it is made from (issue 19, item 9).
func TestCloseFromAcquire(t *testing.T) {
	stopFromHandler(t, "hs-ca", false, func(_ context.Context, c *Coordinator) error { return c.Close() })
}

// A Handler may close its coordinator from the Release of a live lease.
func TestCloseFromRelease(t *testing.T) {
	stopFromHandler(t, "hs-cr", true, func(_ context.Context, c *Coordinator) error { return c.Close() })
}

// A Handler may make its node leave from Acquire, with its own ctx: Leave
// announces the leave and returns; the handoff and the close follow once
// the call returns, whatever became of the call's ctx.
func TestLeaveFromAcquire(t *testing.T) {
	stopFromHandler(t, "hs-la", false, func(ctx context.Context, c *Coordinator) error {
		err := c.Leave(ctx)
		if !c.Leaving() {
			return errors.New("Leave returned, but the node is not leaving")
		}
		return err
	})
}
