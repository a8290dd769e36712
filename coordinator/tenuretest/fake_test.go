package tenuretest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
)

// The fake keeps the coordinator's promises: fence before Acquire, Release
// with the lease live on a move and ended on a revoke, and a takeover
// fences the old lease's writes.
func TestFake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fence, err := ownership.NewMemoryFence(4)
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		acquire bool
		live    bool
		cause   error
	}
	var calls []call
	h := coordinator.HandlerFuncs{
		AcquireFunc: func(ctx context.Context, l *ownership.Lease) error {
			if err := fence.Check(l.Token(), ownership.Exact); err != nil {
				t.Errorf("Acquire before the fence: %v", err)
			}
			calls = append(calls, call{acquire: true, live: l.Err() == nil})
			return nil
		},
		ReleaseFunc: func(ctx context.Context, l *ownership.Lease) error {
			calls = append(calls, call{live: l.Err() == nil, cause: l.Err()})
			return nil
		},
	}
	f, err := tenuretest.NewFake(tenuretest.FakeConfig{Handler: h, Fence: fence, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	l1, err := f.Grant(ctx, 1)
	if err != nil || f.Lease(1) != l1 {
		t.Fatal(err)
	}
	if err := f.Move(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !calls[1].live || !errors.Is(l1.Err(), ownership.ErrLeaseEnded) {
		t.Fatalf("move: calls %+v, lease %v", calls, l1.Err())
	}
	l2, err := f.Grant(ctx, 1)
	if err != nil || l2.Token().Epoch <= l1.Token().Epoch {
		t.Fatalf("regrant %v: %v", l2, err)
	}
	if _, err := f.TakeOver(ctx, 1, "other"); err != nil {
		t.Fatal(err)
	}
	if err := fence.Do(ctx, l2.Token(), ownership.Exact, func() error { return nil }); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("write after a takeover: %v", err)
	}
	cause := errors.New("fenced out")
	if err := f.Revoke(ctx, 1, cause); err != nil {
		t.Fatal(err)
	}
	if last := calls[len(calls)-1]; last.live || !errors.Is(last.cause, cause) || !errors.Is(last.cause, ownership.ErrLeaseEnded) {
		t.Fatalf("revoke: Release saw %+v", last)
	}
	l3, err := f.Grant(ctx, 1) // above the takeover's epoch
	if err != nil || fence.Check(l3.Token(), ownership.Exact) != nil {
		t.Fatalf("grant after a takeover: %v, %v", l3, err)
	}
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Grant(ctx, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("grant after Close: %v", err)
	}
	if _, err := f.Grant(ctx, 9); err == nil {
		t.Fatal("grant of partition 9 of 4 succeeded")
	}
}

// The negative control: an Acquire that fails gets no Release.
func TestFakeAcquireFails(t *testing.T) {
	released := 0
	f, err := tenuretest.NewFake(tenuretest.FakeConfig{Handler: coordinator.HandlerFuncs{
		AcquireFunc: func(context.Context, *ownership.Lease) error { return errors.New("no") },
		ReleaseFunc: func(context.Context, *ownership.Lease) error { released++; return nil },
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.Grant(ctx, 0); err == nil {
		t.Fatal("grant succeeded")
	}
	if f.Lease(0) != nil || f.Close(ctx) != nil || released != 0 {
		t.Fatalf("after a failed Acquire: lease %v, %d releases", f.Lease(0), released)
	}
}
