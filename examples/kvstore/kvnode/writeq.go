package kvnode

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"time"
)

// SQLite keeps no queue for its write lock. A connection that finds it
// taken sleeps in its busy handler (1, 2, 5 … ms, then every 100 ms once
// it has waited 228 ms) and tries again, while a connection that just
// committed, or one that started waiting a moment ago, retries sooner: a
// long waiter almost never finds the lock free. With several nodes
// committing batches into one file, a new owner's claim (one UPDATE of
// the fence table) could wait past the coordinator's AcquireTimeout while
// the others committed hundreds of transactions (issue 20).
//
// writeQueue gives the nodes sharing a SQLite file turns, first come first
// served: every write transaction and every write statement outside one
// takes a turn before it asks SQLite for the lock, and gives it back when
// it ends. A turn is only ever an ordering: SQLite's lock still decides who
// writes, so a turn skipped or lost (see patience) costs fairness, never
// safety, and the fence is unchanged.
//
// Two levels: within a process a FIFO (fifo) lets one writer at a time on
// to the file, so a busy node holds at most one place in the file's queue;
// between processes a ticket queue of byte-range locks on a file beside the
// database (crossQueue, Linux; elsewhere only the process's FIFO).
type writeQueue struct {
	local fifo
	cross *crossQueue // nil: no queue between processes

	// The process's turn in the file's queue, while it lasts: it passes
	// from one local writer to the next (a burst) while they wait, up to
	// maxBurst writers and maxHold, so that a busy node needs fewer
	// hand-offs between processes. Only the holder of local uses them.
	crossEnd func()
	burst    int
	since    time.Time
}

// patience bounds how long a writer waits for the writer ahead of it in
// the file's queue. A turn normally comes within a few transactions; a
// writer ahead that never ends its turn is a process stopped (SIGSTOP,
// a debugger) mid-turn: after patience the writer goes on to SQLite's own
// busy handler, as without the queue, and the queue behind it moves again.
const patience = 500 * time.Millisecond

// A process keeps its turn in the file's queue for at most maxBurst
// writers of its own in a row, and passes it on to no new writer of its
// own after maxHold. A hand-off between processes waits for the next
// process to be scheduled, which on a loaded machine takes milliseconds;
// one per write made the queue slower than the busy handler. So a writer
// waits for at most one burst of each other process.
const (
	maxBurst = 8
	maxHold  = 20 * time.Millisecond
)

// newWriteQueue returns the queue of the SQLite file at dataPath; the
// caller closes it.
func newWriteQueue(dataPath string) (*writeQueue, error) {
	c, err := openCrossQueue(dataPath + "-queue")
	if err != nil {
		return nil, err
	}
	return &writeQueue{cross: c}, nil
}

// acquire waits for a turn to write. It returns the function that ends
// the turn, or ctx's error if ctx ended first.
func (q *writeQueue) acquire(ctx context.Context) (release func(), err error) {
	if err := q.local.lock(ctx); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		q.end()
		return nil, err
	}
	if q.cross != nil && q.crossEnd == nil {
		end, err := q.cross.acquire(ctx)
		if err != nil {
			q.local.unlock()
			return nil, err
		}
		q.crossEnd, q.burst, q.since = end, 0, time.Now()
	}
	q.burst++
	var once sync.Once
	return func() { once.Do(q.end) }, nil
}

// end ends the local holder's turn, and the process's turn in the file's
// queue unless it passes to the next local writer.
func (q *writeQueue) end() {
	if q.crossEnd != nil && (q.burst >= maxBurst || time.Since(q.since) >= maxHold || !q.local.waiting()) {
		q.crossEnd()
		q.crossEnd = nil
	}
	q.local.unlock()
}

// Close closes the queue's file, which ends its turns between processes.
func (q *writeQueue) Close() error {
	if q.cross == nil {
		return nil
	}
	return q.cross.close()
}

// fifo is a mutex that hands itself to its waiters in the order they
// came, and whose lock gives up when its context ends.
type fifo struct {
	mu      sync.Mutex
	held    bool
	waiters []chan struct{}
}

// lock waits for the mutex. It returns ctx's error if ctx ended first;
// if the mutex was handed over as ctx ended, lock returns nil: the caller
// holds it and sees ctx ended.
func (f *fifo) lock(ctx context.Context) error {
	f.mu.Lock()
	if !f.held {
		f.held = true
		f.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	f.waiters = append(f.waiters, ch)
	f.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, w := range f.waiters {
		if w == ch {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			return ctx.Err()
		}
	}
	return nil // handed to us as ctx ended
}

// waiting reports whether a writer waits for the mutex.
func (f *fifo) waiting() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters) > 0
}

func (f *fifo) unlock() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.waiters) == 0 {
		f.held = false
		return
	}
	ch := f.waiters[0]
	f.waiters = f.waiters[1:]
	close(ch) // the lock passes to ch's waiter; held stays true
}

// writes reports whether query, sent outside a transaction, may write:
// anything but a SELECT, whose lock SQLite in WAL mode never needs.
func writes(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n(")
	return len(q) < 6 || !strings.EqualFold(q[:6], "SELECT")
}

// queuedConnector opens the driver's connections with their writes in q's
// turns.
type queuedConnector struct {
	drv driver.Driver
	dsn string
	q   *writeQueue
}

func (c *queuedConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	for _, ok := range []bool{is[driver.ConnBeginTx](conn), is[driver.ExecerContext](conn),
		is[driver.QueryerContext](conn), is[driver.ConnPrepareContext](conn)} {
		if !ok {
			conn.Close()
			return nil, errors.New("kvnode: the SQLite driver lacks a context method the write queue needs")
		}
	}
	return &queuedConn{Conn: conn, q: c.q}, nil
}

func (c *queuedConnector) Driver() driver.Driver { return c.drv }

func is[T any](v any) bool { _, ok := v.(T); return ok }

// queuedConn is a connection whose write transactions, and write
// statements outside a transaction, run in turns. database/sql uses a
// connection from one goroutine at a time.
type queuedConn struct {
	driver.Conn
	q    *writeQueue
	turn func() // the turn of the transaction open on the connection
}

func (c *queuedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts.ReadOnly {
		return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	}
	release, err := c.q.acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		release()
		return nil, err
	}
	c.turn = release
	return &queuedTx{Tx: tx, c: c}, nil
}

func (c *queuedConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// outside takes a turn for query if it runs outside a transaction and may
// write; else it returns a no-op.
func (c *queuedConn) outside(ctx context.Context, query string) (func(), error) {
	if c.turn != nil || !writes(query) {
		return func() {}, nil
	}
	return c.q.acquire(ctx)
}

func (c *queuedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	release, err := c.outside(ctx, query)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *queuedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	release, err := c.outside(ctx, query)
	if err != nil {
		return nil, err
	}
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != nil {
		release()
		return nil, err
	}
	return &queuedRows{Rows: rows, release: release}, nil // a write with RETURNING holds the lock until its rows close
}

func (c *queuedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &queuedStmt{Stmt: s, c: c, query: query}, nil
}

func (c *queuedConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *queuedConn) Close() error {
	err := c.Conn.Close()
	c.end()
	return err
}

func (c *queuedConn) end() {
	if c.turn != nil {
		c.turn()
		c.turn = nil
	}
}

func (c *queuedConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *queuedConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *queuedConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// queuedTx ends its connection's turn when it ends.
type queuedTx struct {
	driver.Tx
	c *queuedConn
}

func (t *queuedTx) Commit() error {
	defer t.c.end()
	return t.Tx.Commit()
}

func (t *queuedTx) Rollback() error {
	defer t.c.end()
	return t.Tx.Rollback()
}

// queuedRows ends its statement's turn when it closes.
type queuedRows struct {
	driver.Rows
	release func()
}

func (r *queuedRows) Close() error {
	defer r.release()
	return r.Rows.Close()
}

// queuedStmt is a prepared statement that takes a turn when it runs
// outside a transaction and may write.
type queuedStmt struct {
	driver.Stmt
	c     *queuedConn
	query string
}

func (s *queuedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	release, err := s.c.outside(ctx, s.query)
	if err != nil {
		return nil, err
	}
	defer release()
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return nil, errors.New("kvnode: the SQLite driver's statements lack ExecContext")
}

func (s *queuedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	release, err := s.c.outside(ctx, s.query)
	if err != nil {
		return nil, err
	}
	q, ok := s.Stmt.(driver.StmtQueryContext)
	if !ok {
		release()
		return nil, errors.New("kvnode: the SQLite driver's statements lack QueryContext")
	}
	rows, err := q.QueryContext(ctx, args)
	if err != nil {
		release()
		return nil, err
	}
	return &queuedRows{Rows: rows, release: release}, nil
}

// Close closes the queue when the database closes.
func (c *queuedConnector) Close() error { return c.q.Close() }
