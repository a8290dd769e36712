package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/tenure-go/tenure/ownership"
)

// Verifier is ownership.Verifier.
//
// Deprecated: use ownership.Verifier, which every fence shares.
type Verifier = ownership.Verifier

// Signer is ownership.Signer.
//
// Deprecated: use ownership.Signer, which every fence shares.
type Signer = ownership.Signer

// Config configures a Fence. The zero Config is valid.
type Config struct {
	// Table is the fence table: a name or schema.name, each part letters,
	// digits and underscores. Default DefaultTable ("tenure_partitions").
	// Give each set of partitions its own table; the fence and the
	// authority of one table must agree on who owns what.
	Table string
	// Verifier, if set, authenticates every token given to Fence and Do
	// and rejects the call when it fails. Default nil: tokens are not
	// authenticated, so any client that can reach the fence can fence out
	// the owners with a large epoch. The check costs one MAC per call.
	Verifier ownership.Verifier
	// Signer, if set, signs the mark of every stale answer (the Current
	// of a *ownership.StaleTokenError, and the mark Fence returns with
	// it). Set it, with Verifier, to the cluster's token keyring when the
	// coordinators have Config.TokenKeys: they don't believe an unsigned
	// current token, so without it a node fenced out here learns the mark
	// only from gossip, claiming again after a backoff meanwhile. Signing
	// vouches for the mark: set Verifier too, so that every mark was
	// authentic when it was fenced. Default nil: marks are reported
	// unsigned.
	Signer ownership.Signer
	// Concurrent lets the Exact transactions of Do and DoConn on one
	// partition run side by side on PostgreSQL: the check takes a shared
	// lock on the partition's row (FOR SHARE) instead of an exclusive
	// one. A fence, or a claim of the SQL authority, still waits for
	// every one of them to end, so the fencing guarantees are unchanged;
	// what goes is the order: transactions of one partition that read and
	// write the same rows must serialize themselves, with row locks
	// (SELECT ... FOR UPDATE) or with the owner's own lock per key. Set it
	// when the owner already serializes its writes per key, or when a
	// partition's transactions must not wait for each other's round
	// trips. A fence or claim that arrives queues the transactions that
	// come after it (the checks take the partition's advisory lock shared
	// first; see Postgres), so writers that keep the partition busy do not
	// hold it off. Each holder of the row's shared lock past the first
	// costs PostgreSQL a multixact: many side by side (hundreds) on one
	// partition add vacuum work. A transaction's fn must not wait for
	// another transaction of the same partition (a nested Do, or locks of
	// the owner's taken in different orders): while a fence waits, the
	// second queues behind it and the first never ends, a wait PostgreSQL
	// can't see as a deadlock. Monotonic transactions still lock the row
	// exclusively (they may raise the mark). SQLite has one writer at a
	// time and ignores it. Default false: the transactions of a partition
	// run one at a time.
	Concurrent bool
}

// Validate reports whether c is usable. It does not modify c.
func (c Config) Validate() error {
	if c.Table == "" {
		return nil
	}
	_, err := quoteTable(c.Table)
	return err
}

// A Fence is the resource side of fencing in a SQL database: one row per
// partition holding the highest token fenced (the mark), and transactions
// that commit only while their token is the mark. It implements
// ownership.Fence.
//
// A Fence is safe for concurrent use; every method may block on the
// database.
type Fence struct {
	db     *sql.DB
	d      Dialect
	sql    statements
	verify ownership.Verifier
	sign   ownership.Signer
	conc   bool // Config.Concurrent

	mu       sync.Mutex
	lockStmt atomic.Pointer[sql.Stmt] // the lock statement, prepared on first use
	closed   bool                     // set by Close: prepare no more
}

var _ ownership.Fence = (*Fence)(nil)

// New returns a fence on db in dialect d. It does not touch the database:
// call CreateSchema once (at deploy or start-up) before the first fence.
// The caller keeps ownership of db and closes it after the last call.
func New(db *sql.DB, d Dialect, cfg Config) (*Fence, error) {
	if db == nil {
		return nil, errors.New("sqlfence: nil *sql.DB")
	}
	if d.name == "" {
		return nil, errors.New("sqlfence: zero Dialect; use SQLite() or Postgres()")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	table, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Fence{db: db, d: d, sql: d.statements(table), verify: cfg.Verifier, sign: cfg.Signer, conc: cfg.Concurrent}, nil
}

// CreateSchema creates the fence table if it does not exist:
//
//	partition_id  BIGINT PRIMARY KEY  the partition
//	epoch         BIGINT              the mark's epoch, at least 1
//	owner         TEXT                the mark's owner node name (bytewise collation)
//	incarnation   TEXT                the mark's owner incarnation, 16 lowercase hex digits
//
// A partition without a row has never been fenced. It is idempotent, but
// on PostgreSQL two processes creating the table at the same instant may see
// one fail; a retry succeeds.
func (f *Fence) CreateSchema(ctx context.Context) error {
	if _, err := f.db.ExecContext(ctx, f.sql.schema); err != nil {
		return fmt.Errorf("sqlfence: create fence table: %w", err)
	}
	return nil
}

// Fence advances t's partition's mark to t if t is higher and returns the
// mark as it stands afterwards. If t is lower than the mark it returns the
// mark and a *ownership.StaleTokenError. Fencing with the mark again
// succeeds, so a fence whose answer was lost can be retried.
//
// A fence waits for every transaction of Do holding the partition to end,
// so when it returns no write under a lower token can commit any more: the
// new owner may read the partition's state.
func (f *Fence) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	if err := f.check(t); err != nil {
		return ownership.Token{}, err
	}
	if raised, err := f.raise(ctx, f.db, t); err != nil {
		return ownership.Token{}, fmt.Errorf("sqlfence: fence %v: %w", t, err)
	} else if raised {
		return t, nil
	}
	// The mark was at or above t; it can only have grown since.
	mark, found, err := f.read(ctx, f.db, f.sql.current, t.Partition)
	if err != nil {
		return ownership.Token{}, fmt.Errorf("sqlfence: fence %v: %w", t, err)
	}
	if !found {
		return ownership.Token{}, fmt.Errorf("sqlfence: fence %v: partition row vanished", t)
	}
	switch c := t.Compare(mark); {
	case c < 0:
		mark = f.signed(mark)
		return mark, ownership.Stale(t, mark)
	case c == 0:
		return t, nil // t is the mark, and keeps its MAC
	}
	// The database did not raise a lower mark: its order of tokens is not
	// Token.Compare's (a column's collation). t is not fenced.
	return mark, fmt.Errorf("sqlfence: fence %v: the database kept the lower mark %v: %w", t, mark, ownership.ErrNotFenced)
}

// Current returns partition p's mark, or the zero token (of partition p) if
// p has never been fenced. The mark may have moved by the time it returns.
func (f *Fence) Current(ctx context.Context, p uint32) (ownership.Token, error) {
	mark, _, err := f.read(ctx, f.db, f.sql.current, p)
	if err != nil {
		return ownership.Token{}, fmt.Errorf("sqlfence: read mark of p%d: %w", p, err)
	}
	return mark, nil
}

// Do runs fn in one transaction that commits only if t is current for its
// partition under mode m, so the check and fn's writes commit or fail
// together:
//
//   - Exact: t must equal the mark. A lower t fails with a
//     *ownership.StaleTokenError carrying the mark; a higher one (never
//     fenced) with an error wrapping ownership.ErrNotFenced: fence, then
//     retry.
//   - Monotonic: t must not be below the mark; a higher t becomes the mark
//     inside the transaction, as a fence would, if the transaction commits.
//
// The check runs first and locks the partition's row until the transaction
// ends: fn sees a mark that cannot change under it, a concurrent Fence waits
// for the commit, and Do transactions on one partition run one at a time
// (different partitions do not wait for each other, except that SQLite has
// one writer for the whole database). With Config.Concurrent, the Exact
// transactions of a partition on PostgreSQL share the lock and run side by
// side; a Fence still waits for all of them.
//
// fn must do all its work through tx and must not commit or roll back.
// If fn returns an error (or panics) the transaction rolls back and Do
// returns fn's error unchanged (or re-panics), unless the server had ended
// the session: then a *SessionEndedError wrapping it (ErrSessionEnded). If ctx has ended when fn
// returns, Do does not commit and returns ctx's error: nothing was applied.
// An error from the commit itself leaves the outcome unknown: it wraps
// ownership.ErrOutcomeUnknown, never a context error (the write may have
// committed, so it must not look like "cancelled, nothing happened"); fence
// or read back before relying on it, and retry only a write the database
// deduplicates.
func (f *Fence) Do(ctx context.Context, t ownership.Token, m ownership.Mode, fn func(tx *sql.Tx) error) error {
	if err := f.checkCall(t, m, fn != nil); err != nil {
		return err
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlfence: begin for %v: %w", t, err)
	}
	defer tx.Rollback() // a no-op after Commit
	if err := f.hold(ctx, tx, t, m); err != nil {
		return f.failed(ctx, tx, t, err)
	}
	if err := fn(tx); err != nil {
		return f.failed(ctx, tx, t, err)
	}
	if err := ctx.Err(); err != nil {
		// database/sql rolls back a transaction whose context ended, and
		// its Commit would not send COMMIT: nothing is applied.
		return fmt.Errorf("sqlfence: not committed under %v: %w", t, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlfence: commit under %v: %w: %v", t, ownership.ErrOutcomeUnknown, err)
	}
	return nil
}

// failed rolls tx back after err, which stops t's transaction before its
// commit, and returns err, or a *SessionEndedError if the rollback could
// not be sent: the server ended the session (a ctx that ended is the
// cause of its own failure instead).
func (f *Fence) failed(ctx context.Context, tx *sql.Tx, t ownership.Token, err error) error {
	rerr := tx.Rollback()
	if rerr == nil || errors.Is(rerr, sql.ErrTxDone) || ctx.Err() != nil ||
		errors.Is(err, ownership.ErrStaleToken) || errors.Is(err, ownership.ErrNotFenced) {
		return err
	}
	return f.sessionEnded(ctx, t, err)
}

// Close releases the statements the fence prepared on db (with SQLite).
// The fence keeps working after Close, preparing its statements on each
// use; db stays open. Close is idempotent and safe to call concurrently
// with other calls.
func (f *Fence) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if s := f.lockStmt.Swap(nil); s != nil {
		if err := s.Close(); err != nil {
			return fmt.Errorf("sqlfence: close: %w", err)
		}
	}
	return nil
}

// lock returns the lock statement prepared on db, preparing it on first
// use, or nil after Close or if the dialect does not prepare it. The table
// must exist before it can be prepared; a failed prepare is retried on the
// next call.
func (f *Fence) lock(ctx context.Context) (*sql.Stmt, error) {
	if s := f.lockStmt.Load(); s != nil {
		return s, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.lockStmt.Load(); s != nil || f.closed || !f.d.prepare {
		return s, nil
	}
	s, err := f.db.PrepareContext(ctx, f.sql.lock)
	if err != nil {
		return nil, err
	}
	f.lockStmt.Store(s)
	return s, nil
}

// shared reports whether Exact checks take a shared lock.
func (f *Fence) shared() bool { return f.conc && f.sql.share != "" }

// lockMark locks partition p's row in tx and returns the mark. In Exact
// mode the lock is shared if the fence is Concurrent; in Monotonic mode,
// which may raise the mark, the partition's advisory lock is taken first,
// where the dialect has one: every statement that takes it takes it before
// the row's lock, so that a raise waiting for the advisory lock never
// holds the row a fence waits for.
func (f *Fence) lockMark(ctx context.Context, tx *sql.Tx, p uint32, m ownership.Mode) (ownership.Token, bool, error) {
	switch {
	case m == ownership.Exact && f.shared():
		return f.read(ctx, tx, f.sql.share, p)
	case m == ownership.Monotonic && f.sql.gatedLock != "":
		return f.read(ctx, tx, f.sql.gatedLock, p)
	}
	s, err := f.lock(ctx)
	if err != nil {
		return ownership.Token{}, false, err
	}
	if s == nil {
		return f.read(ctx, tx, f.sql.lock, p)
	}
	// The statement stays prepared on the connection; the transaction's
	// copy of it is closed with the transaction.
	return f.read(ctx, txStmt{tx.StmtContext(ctx, s)}, "", p)
}

// txStmt makes a prepared statement a querier; the query text is ignored.
type txStmt struct{ s *sql.Stmt }

func (q txStmt) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return q.s.QueryRowContext(ctx, args...)
}

// hold locks t's partition row in tx and checks t against the mark,
// advancing the mark to t in Monotonic mode.
func (f *Fence) hold(ctx context.Context, tx *sql.Tx, t ownership.Token, m ownership.Mode) error {
	return f.judge(ctx, tx, t, m, func() (ownership.Token, error) {
		mark, _, err := f.lockMark(ctx, tx, t.Partition, m) // a missing row is the zero mark
		return mark, err
	})
}

// judge checks t against the mark that lock returns, in a transaction
// whose statements e runs; lock must leave t's partition row locked until
// the transaction ends. In Monotonic mode a higher t becomes the mark.
func (f *Fence) judge(ctx context.Context, e execer, t ownership.Token, m ownership.Mode, lock func() (ownership.Token, error)) error {
	mark, err := lock()
	if err != nil {
		return fmt.Errorf("sqlfence: check %v: %w", t, err)
	}
	if m == ownership.Exact || t.Compare(mark) <= 0 {
		return ownership.Judge(t, f.signed(mark))
	}
	if raised, err := f.raise(ctx, e, t); err != nil {
		return fmt.Errorf("sqlfence: advance to %v: %w", t, err)
	} else if raised {
		return nil // inserted or updated: the row is ours until the end
	}
	// Another transaction inserted the row first (PostgreSQL, when the row
	// was missing). Lock it and compare again.
	mark, err = lock()
	if err != nil {
		return fmt.Errorf("sqlfence: check %v: %w", t, err)
	}
	if t.Compare(mark) != 0 {
		return ownership.Stale(t, f.signed(mark))
	}
	return nil
}

// check rejects tokens the table cannot hold, and unauthentic ones.
func (f *Fence) check(t ownership.Token) error {
	if err := checkToken(t); err != nil {
		return err
	}
	if f.verify != nil {
		if err := f.verify.Verify(t); err != nil {
			return fmt.Errorf("sqlfence: token %v: %w", t, err)
		}
	}
	return nil
}

func checkToken(t ownership.Token) error {
	if t.Epoch == 0 {
		return fmt.Errorf("sqlfence: token %v: epoch 0 is never fenced (epochs start at 1)", t)
	}
	if t.Epoch > math.MaxInt64 {
		return fmt.Errorf("sqlfence: token %v: epoch above 2^63-1", t)
	}
	return checkName(t.Owner)
}

func checkName(name string) error {
	if !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("sqlfence: owner %q: not valid UTF-8 without NUL bytes", name)
	}
	return nil
}

// raise runs the fence statement for t on e and reports whether it
// inserted or updated the partition's row: whether t is now the mark and was
// not before.
func (f *Fence) raise(ctx context.Context, e execer, t ownership.Token) (bool, error) {
	res, err := e.ExecContext(ctx, f.sql.fence, int64(t.Partition), int64(t.Epoch), t.Owner, incarnationText(t.Incarnation))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1 || n == 2 && f.d.upsertTwice, err
}

// incarnationText is the stored form of an incarnation: fixed-width hex,
// so that text order is numeric order.
func incarnationText(inc uint64) string { return fmt.Sprintf("%016x", inc) }

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// read runs query (current or lock) for partition p and returns the mark,
// or the zero token of p and found false if p has no row.
func (f *Fence) read(ctx context.Context, q querier, query string, p uint32) (mark ownership.Token, found bool, err error) {
	var (
		epoch int64
		owner string
		inc   string
	)
	err = q.QueryRowContext(ctx, query, int64(p)).Scan(&epoch, &owner, &inc)
	if errors.Is(err, sql.ErrNoRows) {
		return ownership.Token{Partition: p}, false, nil
	}
	if err != nil {
		return ownership.Token{}, false, err
	}
	return decodeMark(p, epoch, owner, inc)
}

func decodeMark(p uint32, epoch int64, owner, inc string) (ownership.Token, bool, error) {
	n, err := strconv.ParseUint(inc, 16, 64)
	if epoch <= 0 || len(inc) != 16 || err != nil {
		return ownership.Token{}, false, fmt.Errorf("corrupt fence row for p%d: epoch %d, incarnation %q", p, epoch, inc)
	}
	return ownership.Token{Partition: p, Epoch: uint64(epoch), Owner: owner, Incarnation: n}, true, nil
}

// signed returns mark signed by the fence's Signer, if it has one.
func (f *Fence) signed(mark ownership.Token) ownership.Token {
	if f.sign == nil || mark.IsZero() {
		return mark
	}
	return f.sign.Sign(mark)
}
