package main

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// batchedGuard: the writes of each partition go through a
// sqlfence.Batcher, which commits the ones that arrive together in one
// transaction, one batch of a partition at a time, so the partition's
// writes take turns without a lock per key.
//
// tenure_batched is the tenure guard's owner (the same claims, on a fence
// table of its own) committing each batch with the fence's DoConn: the
// token is checked once per batch. unguarded_batched is the same batching
// over plain transactions (the control: what the fence costs once
// amortized, and what a paused holder's late write does without it).
type batchedGuard struct {
	gname string
	owner *tenureGuard // nil: unguarded
	parts *tenureGuard // key -> partition, as tenure's (the owner, or a copy)
	b     *sqlfence.Batcher

	mu     sync.Mutex
	writes int
	waits  []time.Duration // each batch's longest queue wait
}

func newBatchedGuard(name string, owner *tenureGuard, partitions uint32, db *sql.DB) (*batchedGuard, error) {
	g := &batchedGuard{gname: name, owner: owner, parts: owner}
	if owner == nil {
		g.parts = &tenureGuard{partitions: partitions}
	}
	cfg := sqlfence.BatchConfig{Observe: g.observe}
	var err error
	if owner != nil {
		g.b, err = sqlfence.NewBatcher(owner.fence, cfg)
	} else {
		g.b, err = sqlfence.NewBatcherFunc(func(ctx context.Context, _ ownership.Token, _ ownership.Mode, fn func(sqlfence.Tx) error) error {
			return inTx(ctx, db, func(tx *sql.Tx) error { return fn(tx) })
		}, cfg)
	}
	return g, err
}

func (g *batchedGuard) observe(i sqlfence.BatchInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes += i.Writes
	g.waits = append(g.waits, i.Wait)
}

// batchFigures returns the mean batch size and the 99th percentile of the
// longest wait in a batch, in microseconds.
func (g *batchedGuard) batchFigures() (sizeMean, waitP99us float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waits) == 0 {
		return 0, 0
	}
	w := slices.Clone(g.waits)
	slices.Sort(w)
	return float64(g.writes) / float64(len(w)), float64(w[min(len(w)-1, len(w)*99/100)].Microseconds())
}

func (g *batchedGuard) name() string { return g.gname }
func (g *batchedGuard) why() string {
	if g.owner == nil {
		return "nothing guards the key: the late write, in a later batch, lands on top of B's (the control)"
	}
	return "B's claim fenced the partition: the database refuses A's batch under its old token"
}

func (g *batchedGuard) closeBatcher() { g.b.Close() }

func (g *batchedGuard) worker(ctx context.Context, who string) (worker, error) {
	w := &batchedWorker{g: g}
	if g.owner != nil {
		n, err := g.owner.worker(ctx, who)
		if err != nil {
			return nil, err
		}
		w.node = n.(*tenureNode)
	}
	return w, nil
}

type batchedWorker struct {
	g    *batchedGuard
	node *tenureNode // nil: unguarded
}

func (w *batchedWorker) close() {}

// lock returns the worker's token for key's partition (claiming it first,
// as tenure's guard does), or a constant token when unguarded: the
// Batcher needs one to group a partition's writes.
func (w *batchedWorker) lock(ctx context.Context, key string) (held, error) {
	p := w.g.parts.partition(key)
	if w.node == nil {
		return batchedHeld{b: w.g.b, t: ownership.Token{Partition: p, Epoch: 1, Owner: "unguarded"}}, nil
	}
	t, err := w.node.token(ctx, p)
	if err != nil {
		return nil, err
	}
	return batchedHeld{b: w.g.b, t: t}, nil
}

type batchedHeld struct {
	b *sqlfence.Batcher
	t ownership.Token
}

func (h batchedHeld) tx(ctx context.Context, fn func(q sqlfence.Tx) error) error {
	_, _, err := h.b.Do(ctx, h.t, "", func(_ context.Context, tx sqlfence.Tx) ([]byte, error) { return nil, fn(tx) })
	return err
}

func (h batchedHeld) unlock(context.Context) error { return nil }
