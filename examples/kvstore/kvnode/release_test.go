package kvnode

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gate"
	"github.com/tenure-go/tenure/ownership/sqlfence"
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

// A lease that ended (lost, not handed off) fails its writes still queued
// in the Batcher at once, with an error wrapping ErrLeaseEnded that the
// router retries at the next owner, instead of leaving them queued behind
// the batch in flight (and the release waiting for them).
func TestReleaseOfALostLeaseFailsQueuedWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := batchNode(t, ctx)
	lease := ownership.NewLease(context.Background(), ownership.Token{Partition: 2, Epoch: 1, Owner: "n0", Incarnation: 1})
	if _, err := n.fence.Fence(ctx, lease.Token()); err != nil {
		t.Fatal(err)
	}
	if err := n.acquire(ctx, lease); err != nil {
		t.Fatal(err)
	}
	// A batch in flight, held, and a put queued behind it.
	started, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	defer unhold() // before the Batcher's Close, which waits for the batch
	held := make(chan error, 1)
	go func() {
		_, _, err := n.batch.Do(ctx, lease.Token(), "", func(ctx context.Context, _ sqlfence.Tx) ([]byte, error) {
			close(started)
			<-hold
			return nil, nil
		})
		held <- err
	}()
	<-started
	queued := make(chan error, 1)
	go func() {
		_, err := n.put(ctx, lease, "", "k", []byte("v"))
		queued <- err
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for n.batch.Queued(2) != 1 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the put never queued")
		}
	}
	lease.End(errors.New("lost"))
	released := make(chan error, 1)
	go func() { released <- n.release(ctx, lease) }()
	select {
	case err := <-queued:
		if !errors.Is(err, ownership.ErrLeaseEnded) {
			t.Fatalf("a queued put of a lost lease = %v, want an error wrapping ErrLeaseEnded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a queued put of a lost lease still waits after 10 s")
	}
	unhold()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
}

// batchNode is a Node with the database (SQLite), fence, request table,
// Batcher and gate that put needs, and nothing else.
func batchNode(t *testing.T, ctx context.Context) *Node {
	t.Helper()
	db, d, err := openDB(filepath.Join(t.TempDir(), "kv.db"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	n := &Node{db: db, gate: gate.New(4), log: slog.New(slog.DiscardHandler)}
	if n.fence, err = sqlfence.New(db, d, sqlfence.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.fence.Close() })
	if n.reqs, err = sqlfence.NewRequests(d, sqlfence.RequestsConfig{Table: requestsTable}); err != nil {
		t.Fatal(err)
	}
	if err := createSchema(ctx, db, d, n.fence, n.reqs); err != nil {
		t.Fatal(err)
	}
	if n.batch, err = sqlfence.NewBatcher(n.fence, sqlfence.BatchConfig{Requests: n.reqs}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.batch.Close() })
	return n
}
