package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
)

// A lone node on loopback consumes every partition, and its commit hooks
// see every batch: a batch BeforeCommit drops is not committed and is read
// again from the committed offset, and AfterCommit reports each commit's
// result.
func TestNodeCommitHooks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := newStore(t, openSQLite(t), sqlfence.SQLite())

	type commit struct {
		p    uint32
		from int64
		n    int
		err  error
	}
	var (
		mu      sync.Mutex
		dropped *Batch
		before  int // BeforeCommit calls
		commits []commit
	)
	opts := Options{
		BeforeCommit: func(_ context.Context, b Batch) error {
			mu.Lock()
			defer mu.Unlock()
			before++
			if dropped == nil {
				dropped = &b
				return errors.New("not this time")
			}
			return nil
		},
		AfterCommit: func(b Batch, err error) {
			mu.Lock()
			defer mu.Unlock()
			commits = append(commits, commit{b.Token.Partition, b.From, len(b.Events), err})
		},
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = "lone"
	cfg.Ring = ring.DefaultConfig()
	cfg.Ring.Partitions = 4
	n, err := NewNode(store, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}

	var events []Event
	for i := range 100 {
		events = append(events, Event{Partition: uint32(i % 4), Key: fmt.Sprintf("k%d", i%7), Amount: int64(i)})
	}
	if _, err := store.Append(ctx, events...); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := store.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if lag == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d events still not consumed: %v", lag, ctx.Err())
		case <-tick.C:
		}
	}
	if err := n.Leave(ctx); err != nil {
		t.Fatal(err)
	}

	r, err := store.Verify(ctx)
	if err != nil || r.Err() != nil || r.Events != 100 {
		t.Fatalf("Verify = %+v, %v (%v); want 100 events applied once", r, err, r.Err())
	}
	if s := n.Stats(); s.Events != 100 || s.Rejected != 0 || int(s.Batches) != len(commits) {
		t.Errorf("Stats = %+v with %d commits seen by AfterCommit; want 100 events, none rejected", s, len(commits))
	}
	mu.Lock()
	defer mu.Unlock()
	total, redone := 0, false
	for _, c := range commits {
		if c.err != nil {
			t.Errorf("AfterCommit saw p%d@%d fail: %v", c.p, c.from, c.err)
		}
		total += c.n
		redone = redone || (dropped != nil && c.p == dropped.Token.Partition && c.from == dropped.From)
	}
	if before != len(commits)+1 {
		t.Errorf("BeforeCommit called %d times, AfterCommit %d; want one more (the dropped batch)", before, len(commits))
	}
	if total != 100 || !redone {
		t.Errorf("AfterCommit saw %d events, dropped batch %+v committed later: %v; want 100 and true", total, dropped, redone)
	}
}

// The documented defaults of the back-off the node gives its workers (the
// doubling itself is coordinator/worker's, held by its TestIdleBackoff);
// a MaxPollInterval below PollInterval is raised to it.
func TestPollBackoff(t *testing.T) {
	o := Options{}.withDefaults()
	if o.PollInterval != 20*time.Millisecond || o.MaxPollInterval != 250*time.Millisecond || o.BatchSize != 32 {
		t.Errorf("defaults %+v, want PollInterval 20ms, MaxPollInterval 250ms, BatchSize 32", o)
	}
	if o := (Options{PollInterval: time.Second}).withDefaults(); o.MaxPollInterval != time.Second {
		t.Errorf("MaxPollInterval %v with PollInterval 1s, want 1s", o.MaxPollInterval)
	}
}
