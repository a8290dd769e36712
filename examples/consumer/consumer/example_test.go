package consumer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/consumer/consumer"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// The core of a fenced consumer, without a cluster: two owners of one
// partition in turn, as the coordinator would grant it. The first reads a
// batch and stalls before committing; the second fences the partition,
// consumes from the committed offset and commits; the first one's late
// commit is rejected, so no event is applied twice.
func Example() {
	dir, err := os.MkdirTemp("", "consumer-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "log.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()

	store, err := consumer.NewStore(db, sqlfence.SQLite(), "")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	if err := store.CreateSchema(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// The producer: partition 0 here; in a cluster, the ring's
	// Table.PartitionString(key).
	if _, err := store.Append(ctx,
		consumer.Event{Partition: 0, Key: "alice", Amount: 10},
		consumer.Event{Partition: 0, Key: "bob", Amount: 5},
		consumer.Event{Partition: 0, Key: "alice", Amount: 7}); err != nil {
		fmt.Println(err)
		return
	}

	// node-a is granted partition 0 in epoch 1; the coordinator fences
	// the store with the token before node-a reads anything.
	a := ownership.Token{Partition: 0, Epoch: 1, Owner: "node-a", Incarnation: 0xa}
	if _, err := store.Fence().Fence(ctx, a); err != nil {
		fmt.Println(err)
		return
	}
	batch, err := store.ReadBatch(ctx, a, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("node-a read offsets [%d, %d) and stalls\n", batch.From, batch.Next())

	// The partition moves to node-b in epoch 2: fence, read, commit.
	b := ownership.Token{Partition: 0, Epoch: 2, Owner: "node-b", Incarnation: 0xb}
	if _, err := store.Fence().Fence(ctx, b); err != nil {
		fmt.Println(err)
		return
	}
	next, err := store.ReadBatch(ctx, b, 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("node-b commits offsets [%d, %d): %v\n", next.From, next.Next(), store.Commit(ctx, next))

	// node-a wakes up and commits its batch.
	err = store.Commit(ctx, batch)
	fmt.Println("node-a's commit rejected:", errors.Is(err, ownership.ErrStaleToken))

	report, err := store.Verify(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d events, %d applied twice, %d missed\n", report.Events, report.DoubleApplied, report.Missing)
	// Output:
	// node-a read offsets [0, 2) and stalls
	// node-b commits offsets [0, 3): <nil>
	// node-a's commit rejected: true
	// 3 events, 0 applied twice, 0 missed
}

// A consumer process: one Node per process, all on one database. The
// Node's coordinator fences the store on every grant, and a goroutine per
// owned partition consumes it. Here one node consumes a few events alone.
func ExampleNewNode() {
	dir, err := os.MkdirTemp("", "consumer-node-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "log.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	store, err := consumer.NewStore(db, sqlfence.SQLite(), "") // sqlfence.Postgres() for PostgreSQL
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	if err := store.CreateSchema(ctx); err != nil {
		fmt.Println(err)
		return
	}
	cfg := coordinator.LocalConfig() // LANConfig() across machines
	cfg.Name = "consumer-1"
	cfg.Ring.Partitions = 4
	// cfg.Seeds = []string{"10.0.0.2:7946", "10.0.0.3:7946"}
	node, err := consumer.NewNode(store, cfg, consumer.Options{BatchSize: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := node.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := store.Append(ctx, consumer.Event{Partition: 1, Key: "alice", Amount: 3}, consumer.Event{Partition: 2, Key: "bob", Amount: 4}); err != nil {
		fmt.Println(err)
		return
	}
	// ... run until told to stop; watch node.Stats() and store.Lag(ctx).
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for lag, err := store.Lag(ctx); lag > 0 && err == nil; lag, err = store.Lag(ctx) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			fmt.Println("not consumed:", ctx.Err())
			return
		}
	}
	if err := node.Leave(ctx); err != nil { // hands each partition off after its batch in hand
		fmt.Println(err)
	}
	fmt.Println("events consumed:", node.Stats().Events)
	// Output: events consumed: 2
}

// Hooks around each commit, outside the fenced path: an external effect
// the commit waits for, and metrics of every commit's outcome. A batch
// BeforeCommit fails is dropped and read again from the committed offset,
// so the effect must be idempotent.
func ExampleOptions() {
	var sent, committed, rejected atomic.Int64
	opts := consumer.Options{
		BatchSize: 100,
		BeforeCommit: func(ctx context.Context, b consumer.Batch) error {
			// e.g. notify another service, one request per event keyed by
			// its partition and offset: a batch dropped here or rejected at
			// commit is read again, perhaps by a new owner in another epoch
			// and cut into other batches, and the same event must carry
			// the same key. (Send the epoch beside it only if that service
			// fences on it, rejecting epochs lower than one it has seen.)
			sent.Add(int64(len(b.Events)))
			return nil
		},
		AfterCommit: func(b consumer.Batch, err error) {
			switch {
			case err == nil:
				committed.Add(int64(len(b.Events)))
			case errors.Is(err, ownership.ErrStaleToken):
				rejected.Add(1)
			}
		},
	}
	_ = opts // consumer.NewNode(store, cfg, opts)

	// What the hooks see for two batches: one committed, one rejected.
	b := consumer.Batch{Events: make([]consumer.Event, 3)}
	_ = opts.BeforeCommit(context.Background(), b)
	opts.AfterCommit(b, nil)
	opts.AfterCommit(b, ownership.Stale(ownership.Token{Epoch: 1}, ownership.Token{Epoch: 2}))
	fmt.Println(sent.Load(), committed.Load(), rejected.Load())
	// Output: 3 3 1
}
