package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// Func processes one batch of lease's partition: it reads from the
// partition's committed offset, applies, and commits the effects and the
// new offset under lease.Token() (sqlfence.Offsets.Commit), then returns
// how many events the batch held. 0 means the partition had nothing new:
// the worker backs off before it calls again.
//
// ctx ends when the lease is lost (lease.Err() is not nil) or the Runtime
// closes; it does not end for a planned release, which lets the batch in
// hand commit. Func is called on the partition's worker goroutine, one
// call at a time per lease, concurrently for different partitions (at
// most Config.MaxConcurrent at once). It may block.
//
// Its error decides what follows: one wrapping ownership.ErrStaleToken or
// ownership.ErrNotFenced is reported to the coordinator (ReportStale),
// which ends the lease, and the worker stops; any other error (an unknown
// outcome, sqlfence.ErrOffsetMoved, a failed read) is logged and the
// worker backs off, then calls again: Func reads the committed offset
// anew each time. A panic in Func is such an error (logged with its
// stack, counted in Stats.Errors), not a crash of the node.
type Func func(ctx context.Context, lease *ownership.Lease) (int, error)

// Reporter is where a worker reports a write the fence refused: a
// *coordinator.Coordinator. ReportStale must not block for long.
type Reporter interface {
	ReportStale(err error) bool
}

// Config configures a Runtime. Process is required; the zero value of
// every other field means its default.
type Config struct {
	// Process handles one batch of a partition. Required.
	Process Func
	// Start, if set, is called in Handler.Acquire, after the coordinator
	// fenced the lease's token and before the partition's first batch: load
	// the partition's state. An error fails the Acquire (see
	// coordinator.Handler: a stale token drops the lease, another error
	// gives the claim back and retries later) and the worker doesn't start.
	Start func(ctx context.Context, lease *ownership.Lease) error
	// Stop, if set, is called once for every lease whose Start returned nil
	// (every lease whose worker started, without Start). Close while Start
	// runs: the worker never starts and Stop is called in Acquire with
	// coordinator.ErrClosed; after Close, Acquire calls neither. Otherwise
	// it is called on the worker's goroutine after its last batch: err is nil after a
	// planned release (the batch in hand committed), the lease's end cause
	// after a lost lease, the refused write after a stale commit, or
	// coordinator.ErrClosed at Close. It must not block for long.
	Stop func(lease *ownership.Lease, err error)
	// MaxConcurrent bounds the batches in progress at once across every
	// partition of the node: a worker waits for a slot before each call of
	// Process and gives it back after. Size the database's pool to it
	// (sql.DB.SetMaxOpenConns and SetMaxIdleConns to at least
	// MaxConcurrent). Default 8.
	MaxConcurrent int
	// PollInterval is the first back-off after a batch of 0 events or an
	// error; each further one doubles it up to MaxPollInterval, and a
	// batch of events resets it. Default 20 ms.
	PollInterval time.Duration
	// MaxPollInterval caps the back-off: an idle partition is polled about
	// once per MaxPollInterval, and a new event after a quiet spell waits
	// up to that long. Default 500 ms (PollInterval if that is longer).
	MaxPollInterval time.Duration
	// Clock times the back-off. Default coordinator.SystemClock().
	Clock coordinator.Clock
	// Logger receives the workers' logs. Default: discard.
	Logger *slog.Logger
}

// Validate reports whether c is usable. It does not modify c.
func (c Config) Validate() error {
	switch {
	case c.Process == nil:
		return errors.New("worker: Config.Process is required")
	case c.MaxConcurrent < 0:
		return errors.New("worker: Config.MaxConcurrent must not be negative")
	case c.PollInterval < 0 || c.MaxPollInterval < 0:
		return errors.New("worker: Config.PollInterval and MaxPollInterval must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 8
	}
	if c.PollInterval == 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.MaxPollInterval == 0 {
		c.MaxPollInterval = 500 * time.Millisecond
	}
	c.MaxPollInterval = max(c.MaxPollInterval, c.PollInterval)
	if c.Clock == nil {
		c.Clock = coordinator.SystemClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Stats counts a Runtime's work so far.
type Stats struct {
	Batches int64 // calls of Process that returned events and no error
	Events  int64 // events in them
	Stale   int64 // calls whose error was a stale token or a lost fence
	Errors  int64 // calls that failed otherwise
	Running int64 // workers running now
}

// Runtime runs one worker goroutine per partition its coordinator grants:
// it is the coordinator's Handler. Build it with New, set it as
// coordinator.Config.Handler, Bind the coordinator before Start, and
// Close it after the coordinator's Close or Leave.
//
// A worker starts after the fence and Acquire, calls Process in a loop,
// and ends when Release asks (a planned move, Leave: the batch in hand
// commits first and Release waits for it), when the lease is lost (its
// context ends, cancelling the batch in hand), after a stale commit
// (reported to the coordinator), or at Close.
//
// Its methods are safe for concurrent use.
type Runtime struct {
	cfg Config
	log *slog.Logger
	sem chan struct{}

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	rep    atomic.Pointer[Reporter]

	mu      sync.Mutex
	closed  bool
	workers map[*ownership.Lease]*work
	wg      sync.WaitGroup

	batches, events, stale, errs, running atomic.Int64
}

// work is one lease's worker.
type work struct {
	drain     chan struct{} // closed by Release: finish the batch in hand and return
	drainOnce sync.Once
	done      chan struct{} // closed when the goroutine returned
}

var _ coordinator.Handler = (*Runtime)(nil)

// errNotNew is Acquire's error on a Runtime New did not make.
var errNotNew = errors.New("worker: Runtime not made by New")

// New returns a Runtime for cfg. It starts nothing: the coordinator's
// grants start the workers.
func New(cfg Config) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Runtime{cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, cfg.MaxConcurrent), workers: map[*ownership.Lease]*work{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// Bind sets where workers report a stale commit: the coordinator whose
// Handler r is. Call it after coordinator.New and before Start. Until it
// is called, a stale commit ends the lease (Lease.End) without telling
// the coordinator why, so it may claim the partition again at once. A
// nil rep (or a nil *coordinator.Coordinator) unbinds.
func (r *Runtime) Bind(rep Reporter) {
	if c, ok := rep.(*coordinator.Coordinator); rep == nil || ok && c == nil {
		r.rep.Store(nil)
		return
	}
	r.rep.Store(&rep)
}

// Acquire starts the lease's worker, after Config.Start. It is
// coordinator.Handler.Acquire.
func (r *Runtime) Acquire(ctx context.Context, lease *ownership.Lease) error {
	if r.sem == nil {
		return errNotNew
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return coordinator.ErrClosed // no Start without its Stop
	}
	if r.cfg.Start != nil {
		if err := r.cfg.Start(ctx, lease); err != nil {
			return err
		}
	}
	w := &work{drain: make(chan struct{}), done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		// Close came while Start ran: the worker never starts, and the
		// Start it had is paired with its Stop.
		if r.cfg.Stop != nil {
			r.cfg.Stop(lease, coordinator.ErrClosed)
		}
		return coordinator.ErrClosed
	}
	r.workers[lease] = w
	r.wg.Add(1)
	r.running.Add(1)
	go r.run(lease, w)
	return nil
}

// Release stops the lease's worker and waits for it (at most until ctx
// ends). For a planned release the batch in hand commits first; for a
// lost lease it was cancelled. It is coordinator.Handler.Release.
func (r *Runtime) Release(ctx context.Context, lease *ownership.Lease) error {
	r.mu.Lock()
	w := r.workers[lease]
	r.mu.Unlock()
	if w == nil {
		return nil // it stopped on its own (a stale commit)
	}
	w.drainOnce.Do(func() { close(w.drain) })
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("worker: release p%d: %w", lease.Partition(), ctx.Err())
	}
}

// Close cancels every worker's batch and waits for the workers to end.
// Call it after the coordinator's Close (or Leave, which drains them
// first). It is idempotent and returns nil.
func (r *Runtime) Close() error {
	if r.cancel == nil {
		return nil // not made by New: nothing started
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}

// Stats returns the counts so far.
func (r *Runtime) Stats() Stats {
	return Stats{Batches: r.batches.Load(), Events: r.events.Load(), Stale: r.stale.Load(), Errors: r.errs.Load(), Running: r.running.Load()}
}

// run is one lease's worker.
func (r *Runtime) run(lease *ownership.Lease, w *work) {
	// ctx: the lease's, ended at Close too.
	ctx, cancel := context.WithCancel(lease.Context())
	stopClose := context.AfterFunc(r.ctx, cancel)
	why := error(nil)
	defer func() {
		stopClose()
		cancel()
		if r.cfg.Stop != nil {
			r.cfg.Stop(lease, why)
		}
		r.mu.Lock()
		delete(r.workers, lease)
		r.mu.Unlock()
		r.running.Add(-1)
		close(w.done)
		r.wg.Done()
	}()
	log := r.log.With("partition", lease.Partition(), "epoch", lease.Token().Epoch)
	var wait time.Duration // the last back-off; 0 after a batch
	for {
		if why = r.stopped(ctx, lease, w); why != nil || isDrain(w) {
			return
		}
		if !r.slot(ctx, w) {
			continue // stopped: the next round says why
		}
		n, err := r.process(ctx, lease, log)
		<-r.sem
		switch {
		case err == nil && n > 0:
			r.batches.Add(1)
			r.events.Add(int64(n))
			wait = 0
			continue
		case errors.Is(err, ownership.ErrStaleToken) || errors.Is(err, ownership.ErrNotFenced):
			r.stale.Add(1)
			why = err
			log.Info("commit refused by the fence; stopping", "err", err)
			r.reportStale(lease, err)
			return
		case err != nil:
			if ctx.Err() != nil {
				continue // cancelled: the next round says why
			}
			r.errs.Add(1)
			log.Warn("batch", "err", err)
		}
		wait = r.next(wait)
		r.sleep(ctx, w, wait)
	}
}

// process calls Config.Process; a panic in it is the batch's error (its
// transaction, if any, rolled back as the panic left it), not a crash of
// the node: a batch that panics wherever it runs would otherwise take
// every node down in turn.
func (r *Runtime) process(ctx context.Context, lease *ownership.Lease, log *slog.Logger) (n int, err error) {
	defer func() {
		if v := recover(); v != nil {
			log.Error("Process panicked", "panic", v, "stack", string(debug.Stack()))
			n, err = 0, fmt.Errorf("worker: Process of p%d panicked: %v", lease.Partition(), v)
		}
	}()
	return r.cfg.Process(ctx, lease)
}

// stopped returns why the worker must stop now (nil: go on).
func (r *Runtime) stopped(ctx context.Context, lease *ownership.Lease, w *work) error {
	if lease.Err() != nil {
		return lease.Err()
	}
	if r.ctx.Err() != nil {
		return coordinator.ErrClosed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

func isDrain(w *work) bool {
	select {
	case <-w.drain:
		return true
	default:
		return false
	}
}

// slot takes a concurrency slot; false if the worker must stop first.
func (r *Runtime) slot(ctx context.Context, w *work) bool {
	select {
	case r.sem <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-w.drain:
	}
	return false
}

// reportStale tells the coordinator of a refused write, or ends the lease
// if no coordinator is bound (or it did not take the report).
func (r *Runtime) reportStale(lease *ownership.Lease, err error) {
	if p := r.rep.Load(); p != nil && (*p).ReportStale(err) {
		return
	}
	lease.End(fmt.Errorf("%w: %w", ownership.ErrLeaseEnded, err))
}

// next returns the back-off after one of last (0: none yet).
func (r *Runtime) next(last time.Duration) time.Duration {
	if last == 0 {
		return r.cfg.PollInterval
	}
	return min(2*last, r.cfg.MaxPollInterval)
}

// sleep waits d on the clock, or less if the worker must stop.
func (r *Runtime) sleep(ctx context.Context, w *work, d time.Duration) {
	tick, stop := r.cfg.Clock.NewTicker(d)
	defer stop()
	select {
	case <-tick:
	case <-ctx.Done():
	case <-w.drain:
	}
}
