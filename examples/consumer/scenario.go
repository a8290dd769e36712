package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/consumer/consumer"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// Scenario is the self-checking run of the command. A producer appends
// events; Nodes consumer nodes gossip over loopback (through a faultnet
// network, so that one can be cut off) and consume them. Ownership then
// moves in the middle of a batch, deterministically: node-1 reads a batch
// and is held just before its commit (by its Options.BeforeCommit); node-1
// is cut off, the others take its partitions over and consume from the
// last committed offset, past the held batch; then the held batch is let
// go, and the fence must reject its commit. The network heals, node-1
// rejoins, the log is consumed to its end, and Verify checks that no event
// was applied twice or missed.
type Scenario struct {
	DB      *sql.DB
	Dialect sqlfence.Dialect
	// Prefix names the tables (see consumer.NewStore; "" means consumer.DefaultPrefix). They must be empty or absent.
	Prefix string
	// Events is how many events the producer appends. Default 2000.
	Events int
	// Nodes is how many consumer nodes run, at least 3 (one is cut off and
	// the others must keep a majority). Default 3.
	Nodes int
	// Partitions of the log. Default 16.
	Partitions int
	// Keys is how many distinct keys the events carry: enough that every
	// node owns some. Default 100.
	Keys int
	// BatchSize is consumer.Options.BatchSize. Default 32.
	BatchSize int
	// Seed draws the events' keys and amounts.
	Seed uint64
	// Logger receives the nodes' logs. Default: discard.
	Logger *slog.Logger
	// Progress receives a line per step. Default: discard.
	Progress io.Writer
	// Unfenced makes the run the negative control: the held batch is
	// committed without the fence (see unfencedCommit), so its events are
	// applied a second time, and Result.Err must say so.
	Unfenced bool

	// tune, if set, adjusts each node's coordinator configuration (tests).
	tune func(*coordinator.Config)
}

// Result is what a Scenario did and found.
type Result struct {
	consumer.Report
	// Rejected counts the commits the fence rejected, over all nodes.
	Rejected int64
	// Paused is the batch held before its commit while its partition
	// moved; PausedErr is what its commit returned at last.
	Paused    consumer.Batch
	PausedErr error
	Elapsed   time.Duration
}

// Err returns nil if the run kept the promise: every event applied exactly
// once, every offset at the end of the log, and the held batch's commit
// rejected by the fence.
func (r Result) Err() error {
	if err := r.Report.Err(); err != nil {
		return err
	}
	if !errors.Is(r.PausedErr, ownership.ErrStaleToken) {
		return fmt.Errorf("consumer: the stale batch's commit returned %v, want a stale-token error", r.PausedErr)
	}
	return nil
}

// WriteFigures writes the run's figures, one "figure: name value" line each.
func (r Result) WriteFigures(w io.Writer) {
	fmt.Fprintf(w, "figure: consumer.events %d\n", r.Events)
	fmt.Fprintf(w, "figure: consumer.stale_commits_rejected %d\n", r.Rejected)
	fmt.Fprintf(w, "figure: consumer.double_applied %d\n", r.DoubleApplied)
	fmt.Fprintf(w, "figure: consumer.missing %d\n", r.Missing)
	fmt.Fprintf(w, "figure: consumer.seconds %.2f\n", r.Elapsed.Seconds())
}

func (s Scenario) withDefaults() (Scenario, error) {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&s.Events, 2000)
	def(&s.Nodes, 3)
	def(&s.Partitions, 16)
	def(&s.Keys, 100)
	def(&s.BatchSize, 32)
	if s.Prefix == "" {
		s.Prefix = consumer.DefaultPrefix
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.Progress == nil {
		s.Progress = io.Discard
	}
	switch {
	case s.DB == nil:
		return s, errors.New("consumer: Scenario.DB is nil")
	case s.Nodes < 3:
		return s, errors.New("consumer: Scenario.Nodes must be at least 3")
	case s.Events < 3 || s.Keys < 1 || s.BatchSize < 1:
		return s, errors.New("consumer: Scenario needs at least 3 events, 1 key and a batch size of 1")
	}
	return s, nil
}

// Run runs the scenario; it returns an error if it could not (a database
// error, a step that did not happen before ctx ended), and the Result
// otherwise, whose Err says whether the run kept the promise.
func (s Scenario) Run(ctx context.Context) (Result, error) {
	s, err := s.withDefaults()
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	store, err := consumer.NewStore(s.DB, s.Dialect, s.Prefix)
	if err != nil {
		return Result{}, err
	}
	defer store.Close()
	if err := store.CreateSchema(ctx); err != nil {
		return Result{}, err
	}
	if r, err := store.Verify(ctx); err != nil || r.Events != 0 || r.Applications != 0 {
		return Result{}, fmt.Errorf("consumer: the store's tables must start empty (%d events, err %v)", r.Events, err)
	}
	say := func(format string, args ...any) {
		fmt.Fprintf(s.Progress, "  %5.2fs  "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}

	// The cluster: Nodes consumers whose gossip runs through one faultnet
	// network. node-1 holds the first batch it is about to commit.
	network := faultnet.New(faultnet.WithSeed(s.Seed))
	hold := newHolder()
	if s.Unfenced {
		hold.commit = func(ctx context.Context, b consumer.Batch) error {
			return unfencedCommit(ctx, s.DB, s.Prefix, b)
		}
	}
	var nodes []*consumer.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for i := range s.Nodes {
		n, err := s.startNode(ctx, store, network, fmt.Sprintf("node-%d", i), nodes, hold)
		if err != nil {
			return Result{}, err
		}
		nodes = append(nodes, n)
	}
	if err := converged(ctx, nodes); err != nil {
		return Result{}, err
	}
	say("%d nodes own %d partitions", s.Nodes, s.Partitions)

	// The producer places each event in its key's partition. The partition
	// depends only on the key and the partition count, so any node's
	// table gives the same answer.
	table := nodes[0].Coordinator().Table()
	r := rand.New(rand.NewPCG(s.Seed, 1))
	produce := func(count int) error {
		for count > 0 {
			chunk := make([]consumer.Event, min(count, 100))
			for i := range chunk {
				key := fmt.Sprintf("acct-%03d", r.IntN(s.Keys))
				chunk[i] = consumer.Event{Partition: uint32(table.PartitionString(key)), Key: key, Amount: 1 + r.Int64N(100)}
			}
			if _, err := store.Append(ctx, chunk...); err != nil {
				return err
			}
			count -= len(chunk)
		}
		return nil
	}
	// A third of the events before the fault, a third while node-1 is cut
	// off, a third after the heal.
	third := s.Events / 3
	if err := produce(third); err != nil {
		return Result{}, err
	}
	say("produced %d events", third)

	// node-1 has read a batch and computed its effect; its commit is held.
	var res Result
	select {
	case res.Paused = <-hold.held:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("consumer: node-1 never had a batch to commit: %w", ctx.Err())
	}
	p := res.Paused.Token.Partition
	say("node-1 holds a batch of p%d, offsets [%d, %d), before its commit", p, res.Paused.From, res.Paused.Next())

	// Cut node-1 off. The others detect it, wait out the grace period,
	// claim its partitions and fence them; the new owner of p consumes
	// from the committed offset, the start of the held batch, and beyond.
	network.Isolate("node-1")
	say("node-1 cut off from the cluster")
	if err := produce(third); err != nil {
		return Result{}, err
	}
	say("produced %d more events", third)
	err = poll(ctx, "a new owner to commit past the held batch", func() (bool, error) {
		off, err := store.Offset(ctx, p)
		return off >= res.Paused.Next(), err
	})
	if err != nil {
		return Result{}, err
	}
	mark, err := store.Fence().Current(ctx, p)
	if err != nil {
		return Result{}, err
	}
	say("%s took p%d over (epoch %d) and committed past offset %d", mark.Owner, p, mark.Epoch, res.Paused.Next())

	// Let node-1's held batch go: its commit carries the old token.
	close(hold.release)
	select {
	case res.PausedErr = <-hold.result:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("consumer: the held commit did not return: %w", ctx.Err())
	}
	say("node-1's held commit: %v", res.PausedErr)

	// Heal: node-1 rejoins, takes its share back, and everything is
	// consumed.
	network.Heal()
	if err := converged(ctx, nodes); err != nil {
		return Result{}, err
	}
	say("network healed; %d nodes own %d partitions again", s.Nodes, s.Partitions)
	if err := produce(s.Events - 2*third); err != nil {
		return Result{}, err
	}
	say("produced the last %d events", s.Events-2*third)
	err = poll(ctx, "the log to be consumed", func() (bool, error) {
		lag, err := store.Lag(ctx)
		return lag == 0, err
	})
	if err != nil {
		return Result{}, err
	}
	say("all %d events consumed", s.Events)

	for _, n := range nodes {
		n.Close()
		res.Rejected += n.Stats().Rejected
	}
	nodes = nil
	if res.Report, err = store.Verify(ctx); err != nil {
		return Result{}, err
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// startNode starts one consumer node whose gossip runs through network
// and joins the first of others. If hold is set, node-1 commits through it.
func (s Scenario) startNode(ctx context.Context, store *consumer.Store, network *faultnet.Network, name string, others []*consumer.Node, hold *holder) (*consumer.Node, error) {
	tr, err := network.Transport(name, faultnet.TransportConfig{Logger: s.Logger})
	if err != nil {
		return nil, err
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Logger = s.Logger
	cfg.Ring = ring.DefaultConfig()
	cfg.Ring.Partitions = s.Partitions
	ml := *cfg.Memberlist
	ml.Transport = tr
	cfg.Memberlist = &ml
	if len(others) > 0 {
		cfg.Seeds = []string{others[0].Coordinator().GossipAddr()}
	}
	if s.tune != nil {
		s.tune(&cfg)
	}
	opts := consumer.Options{BatchSize: s.BatchSize, Logger: s.Logger}
	if name == "node-1" && hold != nil {
		opts.BeforeCommit, opts.AfterCommit = hold.beforeCommit, hold.afterCommit
	}
	n, err := consumer.NewNode(store, cfg, opts)
	if err != nil {
		tr.Shutdown()
		return nil, err
	}
	if err := n.Start(ctx); err != nil {
		n.Close()
		tr.Shutdown()
		return nil, err
	}
	return n, nil
}

// holder is node-1's BeforeCommit and AfterCommit: it holds the first
// batch before its commit until release is closed, and reports what the
// commit returned.
type holder struct {
	held    chan consumer.Batch // receives the held batch
	release chan struct{}       // closed to let it commit
	result  chan error          // receives what its commit returned
	// commit, if set, commits the held batch instead of the node (the
	// negative control), which then drops it.
	commit func(context.Context, consumer.Batch) error

	mu      sync.Mutex
	taken   bool            // a batch has been held
	pending *consumer.Batch // the held batch, until the node's commit of it returns
}

// errCommittedAside drops the held batch at the node when the negative
// control has committed it.
var errCommittedAside = errors.New("committed without the fence by the negative control")

func newHolder() *holder {
	return &holder{held: make(chan consumer.Batch, 1), release: make(chan struct{}), result: make(chan error, 1)}
}

func (h *holder) beforeCommit(ctx context.Context, b consumer.Batch) error {
	h.mu.Lock()
	first := !h.taken
	h.taken = true
	h.mu.Unlock()
	if !first {
		return nil
	}
	h.held <- b
	select {
	case <-h.release:
	case <-ctx.Done():
		h.result <- ctx.Err()
		return ctx.Err()
	}
	if h.commit != nil {
		h.result <- h.commit(ctx, b)
		return errCommittedAside
	}
	h.mu.Lock()
	h.pending = &b
	h.mu.Unlock()
	return nil // the node commits it; afterCommit reports the result
}

func (h *holder) afterCommit(b consumer.Batch, err error) {
	h.mu.Lock()
	held := h.pending != nil && h.pending.Token == b.Token && h.pending.From == b.From
	if held {
		h.pending = nil
	}
	h.mu.Unlock()
	if held {
		h.result <- err
	}
}

// converged waits until every node sees all of them and holds what the
// ring gives it.
func converged(ctx context.Context, nodes []*consumer.Node) error {
	return poll(ctx, "the cluster to converge", func() (bool, error) {
		for _, n := range nodes {
			if t := n.Coordinator().Table(); t == nil || t.Len() != len(nodes) {
				return false, nil
			}
		}
		for _, n := range nodes {
			c, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
			err := n.Coordinator().WaitConverged(c)
			cancel()
			if err != nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// poll calls cond until it reports true, fails, or ctx ends: every 10 ms,
// or, when cond takes longer than 2.5 ms (Store.Lag counts the whole log),
// four times as long as it took, so that waiting costs the nodes under
// test at most a fifth of the machine.
func poll(ctx context.Context, what string, cond func() (bool, error)) error {
	for {
		start := time.Now()
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("consumer: waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		t := time.NewTimer(max(10*time.Millisecond, 4*time.Since(start)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("consumer: waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}
