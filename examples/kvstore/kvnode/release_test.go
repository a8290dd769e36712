package kvnode

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/gate"
	"github.com/tenure-go/tenure/ownership"
)

// Release closes the partition's gate before the next owner fences: a
// write that arrives after it, under the lease that is still live (a
// planned move releases before the lease ends), is refused as retryable
// before it reaches the database, and Release waits for a write that
// entered before it (the drain).
func TestReleaseClosesTheGate(t *testing.T) {
	n := &Node{gate: gate.New(4)}
	lease := ownership.NewLease(context.Background(), ownership.Token{Partition: 2, Epoch: 1, Owner: "n0", Incarnation: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.acquire(ctx, lease); err != nil {
		t.Fatal(err)
	}
	// A write in flight: release must wait for it.
	if err := n.gate.Enter(lease); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- n.release(ctx, lease) }()
	select {
	case err := <-released:
		t.Fatalf("release returned %v with a write in flight", err)
	case <-time.After(50 * time.Millisecond): // a moment to show it waits
	}
	n.gate.Exit(lease)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	// The lease is live, but the partition is closed to it: put refuses
	// before it touches the database (n has none).
	if _, err := n.put(ctx, lease, "", "k", []byte("v")); !errors.Is(err, ownership.ErrLeaseEnded) {
		t.Fatalf("put after release = %v, want an error wrapping ErrLeaseEnded", err)
	}
}
