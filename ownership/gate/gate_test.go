package gate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gate"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func lease(t *testing.T, p uint32, epoch uint64) (*ownership.Lease, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ownership.NewLease(ctx, ownership.Token{Partition: p, Epoch: epoch, Owner: "n1", Incarnation: 1}), cancel
}

func TestGate(t *testing.T) {
	g := gate.New(4)
	l1, _ := lease(t, 2, 1)
	if err := g.Enter(l1); !errors.Is(err, ownership.ErrLeaseEnded) {
		t.Fatalf("Enter before Open = %v, want ErrLeaseEnded", err)
	}
	if err := g.Open(l1); err != nil {
		t.Fatal(err)
	}
	if err := g.Enter(l1); err != nil || !g.IsOpen(l1) {
		t.Fatalf("Enter after Open = %v", err)
	}
	// Close waits for the write in flight, and refuses new ones at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- g.Close(ctx, l1) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for g.IsOpen(l1) { // Close runs in its goroutine
		select {
		case <-ctx.Done():
			t.Fatal("Close did not close the gate")
		case <-tick.C:
		}
	}
	if err := g.Enter(l1); !errors.Is(err, ownership.ErrLeaseEnded) {
		t.Fatalf("Enter while closing = %v, want ErrLeaseEnded", err)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v with a write in flight", err)
	default:
	}
	g.Exit(l1)
	if err := <-closed; err != nil {
		t.Fatalf("Close after the drain = %v", err)
	}
}

func TestGateCloseBounded(t *testing.T) {
	g := gate.New(1)
	l1, _ := lease(t, 0, 1)
	_ = g.Open(l1)
	if err := g.Enter(l1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := g.Close(ctx, l1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck write = %v, want DeadlineExceeded", err)
	}
	g.Exit(l1)
	if err := g.Close(context.Background(), l1); err != nil {
		t.Fatalf("Close after the drain = %v", err)
	}
}

// Release comes for every lease end, also late: a lease that ended is
// refused without a Close, and a late Close of an old lease leaves a newer
// lease's gate open.
func TestGateLateRelease(t *testing.T) {
	g := gate.New(2)
	l1, end1 := lease(t, 1, 1)
	_ = g.Open(l1)
	end1()
	if err := g.Enter(l1); !errors.Is(err, ownership.ErrLeaseEnded) {
		t.Fatalf("Enter under an ended lease = %v", err)
	}
	l2, _ := lease(t, 1, 2)
	_ = g.Open(l2)
	if err := g.Close(context.Background(), l1); err != nil {
		t.Fatal(err)
	}
	if err := g.Enter(l2); err != nil {
		t.Fatalf("the newer lease's gate was closed by a late Close: %v", err)
	}
	g.Exit(l2)
	g.Exit(l2) // one too many: must not make the next drain wait forever
	if err := g.Enter(l2); err != nil {
		t.Fatal(err)
	}
	g.Exit(l2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Close(ctx, l2); err != nil {
		t.Fatalf("Close after an extra Exit = %v", err)
	}
	l9, _ := lease(t, 9, 1)
	if err := g.Open(l9); !errors.Is(err, ownership.ErrPartitionRange) {
		t.Fatalf("Open out of range = %v", err)
	}
	if err := g.Enter(l9); !errors.Is(err, ownership.ErrPartitionRange) {
		t.Fatalf("Enter out of range = %v", err)
	}
}

// A handler's use of the gate.
func Example() {
	g := gate.New(8)
	l := ownership.NewLease(context.Background(), ownership.Token{Partition: 3, Epoch: 1, Owner: "n1", Incarnation: 1})

	_ = g.Open(l) // Handler.Acquire, after the fence
	write := func() error {
		if err := g.Enter(l); err != nil {
			return err // wraps ownership.ErrLeaseEnded: retried at the next owner
		}
		defer g.Exit(l)
		return nil // the fenced write, under l.Token()
	}
	fmt.Println(write())
	_ = g.Close(context.Background(), l) // Handler.Release: drains
	fmt.Println(errors.Is(write(), ownership.ErrLeaseEnded))
	// Output:
	// <nil>
	// true
}
