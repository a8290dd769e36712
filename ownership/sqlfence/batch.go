package sqlfence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// ErrBatcherClosed is returned for a write given to a closed Batcher, or
// still queued (not yet sent) when Close ran: nothing of it was applied.
// It wraps ownership.ErrLeaseEnded, so a router retries it elsewhere.
var ErrBatcherClosed = fmt.Errorf("sqlfence: batcher closed: %w", ownership.ErrLeaseEnded)

// ErrQueueFull is wrapped, with the context's error, by the error of a
// write whose context ended while it waited for room in its partition's
// full queue: nothing of it was applied.
var ErrQueueFull = errors.New("sqlfence: batcher queue full")

// BatchConfig configures a Batcher. The zero BatchConfig is valid.
type BatchConfig struct {
	// MaxWrites is the most writes one transaction carries (N). Default
	// 32. Keep it at 64 or below with Savepoints on PostgreSQL: each
	// savepoint that writes is a subtransaction, and a transaction with
	// more than 64 of them slows every session's snapshots.
	MaxWrites int
	// MaxWait is how long the first write of a batch waits for more
	// before the batch commits (T), unless the partition was idle: a
	// write that finds no write of its partition queued or committing,
	// and no batch of it ended within MaxWait, commits at once. Default
	// 200 µs.
	MaxWait time.Duration
	// QueueLen bounds each partition's queue of writes not yet sent: a
	// write that finds it full waits for room (or for its context).
	// Default 1024.
	QueueLen int
	// Mode is the mode every batch is checked in. Default
	// ownership.Exact.
	Mode ownership.Mode
	// Requests, if set, deduplicates the writes that carry a request id
	// (see Requests): a duplicate, even in the same batch, gets the first
	// write's result and does not run.
	Requests *Requests
	// Savepoints isolates each write of a batch in a savepoint, so that a
	// write whose fn fails is rolled back alone and the batch goes on.
	// Without it (the default) a failed write rolls the whole transaction
	// back and the batch runs again without it: no statement more per
	// write, but a failure costs a re-run of its batch, and a write's fn
	// may run more than once (only its last run commits). On PostgreSQL and
	// MariaDB a savepoint costs a round trip per write, which the re-run
	// saves: in this package's TestFigures (batches of 8-10 writes), re-runs
	// commit 1.3-1.8x the writes of savepoints 2.3 ms away from PostgreSQL,
	// and up to 1.35x on loopback (PostgreSQL, MariaDB), with no write
	// failing and with one in 20 failing. Each failure costs its batch a
	// run, so savepoints win only when a batch usually holds more than one
	// failing write.
	Savepoints bool
	// Timeout bounds each batch's transactions, its re-runs included (its
	// writes' fns get a ctx that ends then). Default 30 s. It is a
	// context's deadline, so it runs on the system clock, not on Clock.
	Timeout time.Duration
	// Clock times MaxWait: when a write was queued, how long a batch
	// waits, and how long a flusher lingers. Default
	// ownership.SystemClock().
	Clock ownership.Clock
	// Observe, if set, is called after each batch with its figures, from
	// the partition's flusher: it must not block.
	Observe func(BatchInfo)
}

// BatchInfo describes one batch a Batcher sent, for Config.Observe.
type BatchInfo struct {
	Partition uint32
	Writes    int           // writes in the batch
	Wait      time.Duration // the longest any of them waited in the queue
	Runs      int           // transactions it took (more than 1 after re-runs)
	Err       error         // the batch's own outcome: nil if it committed
}

// A Batcher is a per-partition group commit: the writes given to Do for a
// partition queue, and one flusher per partition commits them in order, in
// one fenced transaction (Fence.DoConn) per batch, checking the token
// once. A batch is sent when it holds MaxWrites writes or its first write
// has waited MaxWait, whichever comes first, or at once when the partition
// was idle (no write queued or committing, no batch ended within
// MaxWait), so a lone write pays no wait.
//
// Each write gets its own outcome from Do:
//
//   - applied: nil, and fn's result;
//   - its own error: fn's error, unchanged; the rest of its batch goes on
//     (see BatchConfig.Savepoints) and nothing of this write is applied;
//   - refused: the token is not the mark (a *ownership.StaleTokenError, or
//     ownership.ErrNotFenced), the lease ended (Cancel, Close:
//     ownership.ErrLeaseEnded), the database ended the batch's session
//     (a *SessionEndedError, with the stale token if the mark had moved),
//     or the transaction failed before its commit was sent: nothing of the
//     batch was applied;
//   - unknown: the commit was sent and its answer lost: an error wrapping
//     ownership.ErrOutcomeUnknown, for every write of the batch.
//
// A caller whose context ends while its write is queued gets the
// context's error (not sent, nothing applied); once the write was sent, Do
// waits for its batch's outcome and returns it (see Do).
//
// A write waits for room when its partition's queue is full (QueueLen),
// until its context ends. Writes of one partition under different tokens
// go in different batches.
//
// A Batcher is safe for concurrent use. Close it before the Fence.
type Batcher struct {
	commitFn CommitFunc
	cfg      BatchConfig

	done chan struct{} // closed by Close
	wg   sync.WaitGroup

	mu     sync.Mutex
	queues map[uint32]*queue
	closed bool
}

// queue is one partition's writes not yet sent, and its flusher's state.
type queue struct {
	calls   []*call       // in arrival order
	running bool          // a flusher runs for the partition
	busy    bool          // a batch is being committed
	ended   time.Time     // when the last batch ended
	idle    bool          // a write found the partition idle: send at once
	more    chan struct{} // a write was queued (capacity 1)
	space   chan struct{} // closed when writes leave the queue
}

// call is one write given to Do.
type call struct {
	t   ownership.Token
	id  string
	fn  func(ctx context.Context, tx Tx) ([]byte, error)
	at  time.Time
	ctx context.Context

	// Guarded by the Batcher's mu until done is closed.
	sent bool
	gone bool // taken out of the queue by its caller, Cancel or Close

	result []byte
	dup    bool
	err    error
	done   chan struct{}
}

// errNotMade is Do's answer on a Batcher not made by NewBatcher.
var errNotMade = errors.New("sqlfence: Batcher not made by NewBatcher or NewBatcherFunc")

// A CommitFunc runs fn in one transaction under t in mode m and commits
// it, as Fence.DoConn does.
type CommitFunc func(ctx context.Context, t ownership.Token, m ownership.Mode, fn func(tx Tx) error) error

// NewBatcher returns a Batcher committing through f (Fence.DoConn).
func NewBatcher(f *Fence, cfg BatchConfig) (*Batcher, error) {
	if f == nil {
		return nil, errors.New("sqlfence: NewBatcher: nil Fence")
	}
	return NewBatcherFunc(f.DoConn, cfg)
}

// NewBatcherFunc returns a Batcher that commits each batch with commit
// instead of a Fence: the batches are exactly as fenced as commit makes
// them. It is for measuring what the fence costs once amortized (the same
// batching over unfenced transactions) and for other engines' fences;
// a program guarding its writes uses NewBatcher.
func NewBatcherFunc(commit CommitFunc, cfg BatchConfig) (*Batcher, error) {
	if commit == nil {
		return nil, errors.New("sqlfence: NewBatcherFunc: nil commit")
	}
	if cfg.MaxWrites < 0 || cfg.MaxWait < 0 || cfg.QueueLen < 0 || cfg.Timeout < 0 {
		return nil, errors.New("sqlfence: NewBatcher: negative MaxWrites, MaxWait, QueueLen or Timeout")
	}
	if cfg.Mode != ownership.Exact && cfg.Mode != ownership.Monotonic {
		return nil, fmt.Errorf("sqlfence: NewBatcher: unknown mode %d", cfg.Mode)
	}
	if cfg.MaxWrites == 0 {
		cfg.MaxWrites = 32
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 200 * time.Microsecond
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = 1024
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = ownership.SystemClock()
	}
	return &Batcher{commitFn: commit, cfg: cfg, done: make(chan struct{}), queues: map[uint32]*queue{}}, nil
}

// Do queues fn, a write to t's partition under t, and returns its outcome
// (see Batcher) once its batch has committed or failed. fn runs in the
// batch's transaction, after the writes queued before it: it must act only
// through tx, must not commit, roll back or set savepoints, must close
// every *sql.Rows it opens, and must return the error of any statement
// that failed (on PostgreSQL a failed statement aborts the transaction: a
// write that swallows one makes the writes after it fail, and its batch's
// commit read as unknown), and must not wait for another write of the same
// partition through b (its flusher is running fn: such a wait ends only
// with the batch's Timeout). Its ctx is the batch's, not the caller's.
//
// id, if not empty, is the write's request id (BatchConfig.Requests must
// be set): a write whose id was recorded, by an earlier batch or earlier
// in the same one, does not run, and Do returns the recorded result and
// dup true.
//
// If ctx ends while the write waits for room (its error wraps
// ErrQueueFull too) or in the queue, Do returns ctx's error and nothing of
// it is applied; once its batch was sent, Do waits for the batch's
// outcome (bounded by BatchConfig.Timeout, if the batch's fns heed their
// ctx) and returns it: a write that committed says so, rather than leave
// its caller in doubt.
func (b *Batcher) Do(ctx context.Context, t ownership.Token, id string, fn func(ctx context.Context, tx Tx) ([]byte, error)) (result []byte, dup bool, err error) {
	if b.commitFn == nil {
		return nil, false, errNotMade
	}
	if err := checkToken(t); err != nil {
		return nil, false, err
	}
	if fn == nil {
		return nil, false, errors.New("sqlfence: Batcher.Do: nil write function")
	}
	if id != "" && b.cfg.Requests == nil {
		return nil, false, errors.New("sqlfence: Batcher.Do: a request id without BatchConfig.Requests")
	}
	c := &call{t: t, id: id, fn: fn, ctx: ctx, done: make(chan struct{})}
	if err := b.enqueue(ctx, c); err != nil {
		return nil, false, err
	}
	select {
	case <-c.done:
		return c.result, c.dup, c.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if !c.sent && !c.gone {
		b.remove(c)
		b.mu.Unlock()
		return nil, false, fmt.Errorf("sqlfence: write under %v not sent: %w", t, ctx.Err())
	}
	b.mu.Unlock()
	// Sent: the batch can't leave this write out any more, so its outcome
	// is the batch's, which comes within BatchConfig.Timeout.
	<-c.done
	return c.result, c.dup, c.err
}

// enqueue adds c to its partition's queue, waiting for room, and starts
// the partition's flusher if none runs.
func (b *Batcher) enqueue(ctx context.Context, c *call) error {
	p := c.t.Partition
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return ErrBatcherClosed
		}
		q := b.queues[p]
		if q == nil {
			q = &queue{more: make(chan struct{}, 1), space: make(chan struct{})}
			b.queues[p] = q
		}
		if len(q.calls) < b.cfg.QueueLen {
			c.at = b.cfg.Clock.Now()
			if !q.running {
				q.idle = true // no batch queued, committing, or ended within MaxWait
			}
			q.calls = append(q.calls, c)
			if !q.running {
				q.running = true
				b.wg.Add(1)
				go b.flush(p, q)
			} else {
				select {
				case q.more <- struct{}{}:
				default:
				}
			}
			b.mu.Unlock()
			return nil
		}
		space := q.space
		b.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return fmt.Errorf("sqlfence: write under %v, p%d: %w: %w", c.t, p, ErrQueueFull, ctx.Err())
		case <-b.done:
			return ErrBatcherClosed
		}
	}
}

// remove takes c, not yet sent, out of its queue. b.mu is held.
func (b *Batcher) remove(c *call) {
	c.gone = true
	q := b.queues[c.t.Partition]
	if q == nil {
		return
	}
	for i, x := range q.calls {
		if x == c {
			q.calls = append(q.calls[:i:i], q.calls[i+1:]...)
			b.freed(q)
			return
		}
	}
}

// freed wakes the writes waiting for room in q. b.mu is held.
func (b *Batcher) freed(q *queue) {
	close(q.space)
	q.space = make(chan struct{})
}

// Cancel fails the writes under t still queued (not yet sent) with an
// error wrapping ownership.ErrLeaseEnded: call it when t's lease ends, so
// they go to the next owner at once. Writes already sent get their
// batch's outcome.
func (b *Batcher) Cancel(t ownership.Token) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[t.Partition]
	if q == nil {
		return
	}
	kept := q.calls[:0:0]
	for _, c := range q.calls {
		if c.t.Compare(t) == 0 {
			c.gone = true
			c.err = fmt.Errorf("sqlfence: write under %v not sent: %w", t, ownership.ErrLeaseEnded)
			close(c.done)
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) != len(q.calls) {
		q.calls = kept
		b.freed(q)
	}
}

// Close fails the writes still queued with ErrBatcherClosed, waits for the
// batches being committed to end, and makes every later Do fail. It is
// idempotent, and a no-op on a Batcher not made by NewBatcher.
func (b *Batcher) Close() error {
	b.mu.Lock()
	if !b.closed && b.done != nil {
		b.closed = true
		close(b.done)
		for _, q := range b.queues {
			for _, c := range q.calls {
				c.gone = true
				c.err = ErrBatcherClosed
				close(c.done)
			}
			q.calls = nil
			b.freed(q)
		}
	}
	b.mu.Unlock()
	b.wg.Wait()
	return nil
}

// flush is partition p's flusher: it sends q's writes in batches until q is
// empty, then ends.
func (b *Batcher) flush(p uint32, q *queue) {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		var wait time.Duration
		if len(q.calls) == 0 {
			// Linger for MaxWait after the last batch: a write that
			// comes meanwhile is not alone, and waits for company.
			wait = q.ended.Add(b.cfg.MaxWait).Sub(b.cfg.Clock.Now())
			if wait <= 0 || b.closed {
				q.running = false
				delete(b.queues, p)
				b.mu.Unlock()
				return
			}
		}
		n := 0
		if len(q.calls) > 0 {
			n = b.sameToken(q.calls)
			wait = q.calls[0].at.Add(b.cfg.MaxWait).Sub(b.cfg.Clock.Now())
		}
		if n > 0 && (q.idle || n >= b.cfg.MaxWrites || n < len(q.calls) || wait <= 0) {
			batch := make([]*call, min(n, b.cfg.MaxWrites))
			copy(batch, q.calls)
			q.calls = append(q.calls[:0:0], q.calls[len(batch):]...)
			for _, c := range batch {
				c.sent = true
			}
			q.idle, q.busy = false, true
			b.freed(q)
			b.mu.Unlock()
			b.commit(p, q, batch)
			continue
		}
		b.mu.Unlock()
		// wait > 0 here: a flusher with no write left and no wait ended
		// above, and writes with none left went as a batch.
		tick, stop := b.cfg.Clock.NewTicker(wait)
		select {
		case <-q.more:
		case <-tick:
		case <-b.done:
		}
		stop()
	}
}

// sameToken is how many of calls, from the first, carry the first's token.
func (b *Batcher) sameToken(calls []*call) int {
	t := calls[0].t
	for i, c := range calls {
		if c.t != t {
			return i
		}
	}
	return len(calls)
}

// errRerun is what a batch's fn returns when write i failed without a
// savepoint, with err: the transaction rolls back, and the batch runs
// again without it, unless the session had ended (then err may be the
// session's end, not the write's own failure, and the batch fails whole).
type errRerun struct {
	i   int
	err error
}

func (e errRerun) Error() string {
	return fmt.Sprintf("sqlfence: write %d of the batch failed: %v", e.i, e.err)
}

func (e errRerun) Unwrap() error { return e.err }

// commit sends batch, writes of partition p under one token, and gives each
// its outcome.
func (b *Batcher) commit(p uint32, q *queue, batch []*call) {
	sent := b.cfg.Clock.Now()
	info := BatchInfo{Partition: p, Writes: len(batch)}
	for _, c := range batch {
		info.Wait = max(info.Wait, sent.Sub(c.at))
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	t := batch[0].t
	live := batch
	var err error
	for len(live) > 0 {
		info.Runs++
		for _, c := range live {
			c.result, c.dup, c.err = nil, false, nil
		}
		err = b.commitFn(ctx, t, b.cfg.Mode, func(tx Tx) error { return b.run(ctx, tx, live) })
		var rerun errRerun
		if !errors.As(err, &rerun) || errors.Is(err, ErrSessionEnded) {
			break
		}
		// live[rerun.i] failed and keeps its error; the rest run again.
		live = append(live[:rerun.i:rerun.i], live[rerun.i+1:]...)
	}
	info.Err = err
	for _, c := range live {
		if err != nil {
			c.result, c.dup, c.err = nil, false, err
		}
	}
	if b.cfg.Observe != nil {
		b.cfg.Observe(info)
	}
	b.mu.Lock()
	q.busy, q.ended = false, b.cfg.Clock.Now() // before the callers learn
	b.mu.Unlock()
	for _, c := range batch {
		close(c.done)
	}
}

// run runs the writes of a batch in tx, in order.
func (b *Batcher) run(ctx context.Context, tx Tx, calls []*call) error {
	for i, c := range calls {
		if b.cfg.Savepoints {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT tenure_write"); err != nil {
				return fmt.Errorf("sqlfence: savepoint: %w", err)
			}
		}
		c.result, c.dup, c.err = b.once(ctx, tx, c)
		if c.err == nil {
			continue // the savepoint stays: the next nests in it
		}
		if !b.cfg.Savepoints {
			return errRerun{i, c.err}
		}
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT tenure_write"); err != nil {
			return fmt.Errorf("sqlfence: roll back to savepoint: %w", err)
		}
	}
	return nil
}

// once runs c's fn in tx, through the request table if c has an id. A
// panic in fn is c's error, not the flusher's.
func (b *Batcher) once(ctx context.Context, tx Tx, c *call) (result []byte, dup bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			result, dup, err = nil, false, fmt.Errorf("sqlfence: write under %v panicked: %v", c.t, r)
		}
	}()
	run := func() ([]byte, error) { return c.fn(ctx, tx) }
	if c.id == "" {
		result, err = run()
		return result, false, err
	}
	return b.cfg.Requests.Once(ctx, tx, c.t.Partition, c.id, run)
}

// Queued is the number of writes of partition p waiting in b's queue, not
// yet sent: the depth a full queue (BatchConfig.QueueLen) pushes back at.
func (b *Batcher) Queued(p uint32) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[p]; q != nil {
		return len(q.calls)
	}
	return 0
}
