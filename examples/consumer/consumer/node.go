package consumer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// Options tune a Node. The zero Options is valid.
type Options struct {
	// BatchSize is the most events read, applied and committed at once.
	// Larger batches commit less often; a rejected batch wastes more work.
	// Default 32.
	BatchSize int
	// PollInterval is the first wait when a partition has no new events,
	// or after a failed read or commit. Default 20 ms.
	PollInterval time.Duration
	// MaxPollInterval caps the wait while a partition stays idle: each
	// empty (or failed) read doubles the wait from PollInterval up to
	// MaxPollInterval, and a batch brings it back to PollInterval. An idle
	// node reads each of its partitions about once per MaxPollInterval; a
	// new event after a quiet spell waits up to that long. Default 250 ms
	// (PollInterval if that is longer).
	MaxPollInterval time.Duration
	// Logger receives the node's logs. Default: discard.
	Logger *slog.Logger

	// BeforeCommit, if set, is called with each batch after it is read and
	// before it is committed, on the partition's goroutine, with the
	// commit's context (which ends at Close, not when the lease ends: the
	// fence, not the context, rejects a batch that outlived its lease).
	// Returning an error drops the batch: nothing is committed, and the
	// events are read again from the committed offset after PollInterval.
	// Use it for work the commit must wait for, such as an effect outside
	// the database sent with an idempotency key (see the package doc). It
	// may block; a graceful handoff waits for it.
	BeforeCommit func(ctx context.Context, b Batch) error
	// AfterCommit, if set, is called with each batch the node committed or
	// tried to, and Store.Commit's result: nil, an error wrapping
	// ownership.ErrStaleToken (the batch was rejected and the node stops
	// consuming the partition), sqlfence.ErrOffsetMoved (an earlier commit of the
	// batch had landed; nothing was applied), or another error (perhaps
	// committed: an error wrapping ownership.ErrOutcomeUnknown; the next
	// batch is read from the committed offset). Use it for metrics and
	// tracing; it must not block.
	AfterCommit func(b Batch, err error)
}

func (o Options) withDefaults() Options {
	if o.BatchSize <= 0 {
		o.BatchSize = 32
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 20 * time.Millisecond
	}
	if o.MaxPollInterval <= 0 {
		o.MaxPollInterval = 250 * time.Millisecond
	}
	o.MaxPollInterval = max(o.MaxPollInterval, o.PollInterval)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// Stats counts a node's commits.
type Stats struct {
	Batches  int64 // batches committed
	Events   int64 // events in them
	Rejected int64 // commits the fence rejected (stale token)
}

// Node is one consumer process: an embedded coordinator whose Handler is
// a worker.Runtime, which runs one worker per partition the node is
// granted; each consumes the partition's events from the committed
// offset and commits its outputs and offset with fenced writes.
//
// Its methods are safe for concurrent use.
type Node struct {
	store *Store
	opts  Options
	rt    *worker.Runtime
	c     *coordinator.Coordinator

	// ctx bounds the commits and ends at Close. Commits do not use the
	// lease's context: a commit already on its way when the lease ends is
	// what the fence is for, and the example must show it.
	ctx    context.Context
	cancel context.CancelFunc

	batches, events, rejected atomic.Int64
}

// NewNode returns a node consuming store's partitions. cfg is the
// coordinator's configuration (from a preset, with Name, Seeds and
// addresses set); NewNode sets its Handler and its Fence (the store's
// fence, so that every new owner fences the partition before it reads the
// offset). Call Start.
func NewNode(store *Store, cfg coordinator.Config, opts Options) (*Node, error) {
	opts = opts.withDefaults()
	n := &Node{store: store, opts: opts}
	rt, err := worker.New(worker.Config{
		Process:         n.process,
		PollInterval:    opts.PollInterval,
		MaxPollInterval: opts.MaxPollInterval,
		Logger:          opts.Logger.With("node", cfg.Name),
	})
	if err != nil {
		return nil, err
	}
	cfg.Handler = rt
	cfg.Fence = store.Fence()
	c, err := coordinator.New(cfg)
	if err != nil {
		return nil, err
	}
	rt.Bind(c)
	n.rt, n.c = rt, c
	n.ctx, n.cancel = context.WithCancel(context.Background())
	return n, nil
}

// Start joins the cluster (coordinator.Coordinator.Start); the node starts
// consuming the partitions it is granted.
func (n *Node) Start(ctx context.Context) error { return n.c.Start(ctx) }

// Coordinator returns the node's coordinator.
func (n *Node) Coordinator() *coordinator.Coordinator { return n.c }

// Leave hands every partition off (each consumer finishes the batch in
// hand and commits it), leaves the cluster and stops.
func (n *Node) Leave(ctx context.Context) error {
	err := n.c.Leave(ctx)
	n.stop()
	return err
}

// Close stops at once: to the other nodes this is a crash. A batch being
// committed is abandoned; its partition's next owner consumes it again
// from the committed offset. Close is idempotent.
func (n *Node) Close() error {
	err := n.c.Close()
	n.stop()
	return err
}

// stop cancels the commits still running and waits for every consumer.
func (n *Node) stop() {
	n.cancel()
	n.rt.Close()
}

// Stats returns the node's counts so far.
func (n *Node) Stats() Stats {
	return Stats{Batches: n.batches.Load(), Events: n.events.Load(), Rejected: n.rejected.Load()}
}

// process is the worker's Func: read a batch from the committed offset,
// commit its effect and the new offset in one fenced transaction. The
// offset is read again for every batch, and checked again inside the
// commit, so a commit whose outcome was unknown is never applied twice.
// The runtime reports a stale commit to the coordinator and stops.
func (n *Node) process(ctx context.Context, lease *ownership.Lease) (int, error) {
	b, err := n.store.ReadBatch(ctx, lease.Token(), n.opts.BatchSize)
	if err != nil || len(b.Events) == 0 {
		return 0, err
	}
	// The lease may end from here on without this goroutine noticing (a
	// GC pause, a stopped process, a slow network): checking lease.Err()
	// before committing would narrow that window, never close it. The
	// fence closes it.
	if n.opts.BeforeCommit != nil {
		if err := n.opts.BeforeCommit(n.ctx, b); err != nil {
			return 0, err // dropped: read again after the back-off
		}
	}
	err = n.store.Commit(n.ctx, b)
	if n.opts.AfterCommit != nil {
		n.opts.AfterCommit(b, err)
	}
	switch {
	case err == nil:
		n.batches.Add(1)
		n.events.Add(int64(len(b.Events)))
	case errors.Is(err, ownership.ErrStaleToken):
		n.rejected.Add(1)
	case errors.Is(err, sqlfence.ErrOffsetMoved):
		// An earlier commit whose outcome was unknown did land: these
		// events are applied; carry on from the committed offset.
		return len(b.Events), nil
	}
	return len(b.Events), err
}
