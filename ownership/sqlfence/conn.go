package sqlfence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// Tx runs the statements of one transaction: *sql.Tx has these methods,
// and so does what DoConn hands its fn.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var _ Tx = (*sql.Tx)(nil)

// connTx is the Tx DoConn hands fn: the statements of conn, and nothing
// else of it (no BeginTx, Raw or Close).
type connTx struct{ c *sql.Conn }

func (x connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return x.c.ExecContext(ctx, query, args...)
}

func (x connTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return x.c.QueryContext(ctx, query, args...)
}

func (x connTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return x.c.QueryRowContext(ctx, query, args...)
}

// endTimeout bounds the ROLLBACK that DoConn sends when a transaction
// fails, which runs even if the caller's context has ended.
const endTimeout = 10 * time.Second

// DoConn is Do in one round trip to the database fewer: on PostgreSQL the
// check travels with BEGIN, in one message, so a fenced transaction of
// one statement takes the round trips of the same transaction unfenced
// (BEGIN, the statement, COMMIT); the server still runs the check, a
// statement of its own. It promises what Do promises, in the same modes,
// and returns the same errors.
//
// The price: fn gets a Tx, not a *sql.Tx. DoConn takes a connection of
// its own from the pool and sends BEGIN and COMMIT itself, so database/sql
// does not know a transaction is open. fn must run every statement
// through tx, must close every *sql.Rows before it returns, and must not
// send BEGIN, COMMIT, ROLLBACK or SAVEPOINT statements, nor change the
// session's search_path or its prepared statements named tenure_* (they
// outlive the transaction on the pooled connection; a schema-qualified
// Config.Table is immune to the search_path). A connection whose
// transaction can't be ended cleanly is closed, not returned to the pool.
//
// On PostgreSQL the driver must run a parameterless Exec of several
// statements in one round trip (the simple query protocol) and report the
// rows of the last one as rows affected, as github.com/jackc/pgx/v5/stdlib
// and github.com/lib/pq do; a driver that doesn't makes DoConn fail, never
// write unchecked. The token is sent as literals (see the package doc).
// The check is a statement prepared on each connection the first time
// DoConn uses it; keep a pooler in transaction mode out of the way.
//
// On SQLite, which has no round trips to save, DoConn is Do: fn gets the
// *sql.Tx.
//
// If fn returns an error, DoConn rolls back and returns it unchanged,
// unless the server had ended the session (see ErrSessionEnded: the error
// then wraps fn's); a panic in fn rolls back and goes on. As with Do, a ctx ended when fn
// returns means no commit and ctx's error, and an error from the commit
// itself wraps ownership.ErrOutcomeUnknown and no context error.
func (f *Fence) DoConn(ctx context.Context, t ownership.Token, m ownership.Mode, fn func(tx Tx) error) error {
	if err := f.checkCall(t, m, fn != nil); err != nil {
		return err
	}
	if !f.d.oneTrip {
		return f.Do(ctx, t, m, func(tx *sql.Tx) error { return fn(tx) })
	}
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlfence: connection for %v: %w", t, err)
	}
	defer conn.Close() // after end: a no-op once end discarded it
	done := false
	defer func() {
		if !done {
			f.end(ctx, conn, "ROLLBACK")
		}
	}()
	if err := f.begin(ctx, conn, t, m); err != nil {
		return err
	}
	if err := fn(connTx{conn}); err != nil {
		done = true
		if !f.end(ctx, conn, "ROLLBACK") && ctx.Err() == nil {
			return f.sessionEnded(ctx, t, err) // the server ended the session
		}
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqlfence: not committed under %v: %w", t, err) // rolled back
	}
	done = true
	// A COMMIT of a transaction in which a statement failed rolls back
	// without an error on PostgreSQL; the SELECT before it fails instead,
	// so such a transaction never reports success.
	if _, err := conn.ExecContext(ctx, "SELECT 1; COMMIT"); err != nil {
		f.end(ctx, conn, "ROLLBACK")
		return fmt.Errorf("sqlfence: commit under %v: %w: %v", t, ownership.ErrOutcomeUnknown, err)
	}
	return nil
}

// begin opens the transaction on conn and checks t in one message,
// leaving t's partition row locked if t passes.
func (f *Fence) begin(ctx context.Context, conn *sql.Conn, t ownership.Token, m ownership.Mode) error {
	msg := f.sql.beginCheck(t, m, f.shared())
	res, err := conn.ExecContext(ctx, msg)
	if err != nil {
		// Perhaps the statements are not prepared on this connection yet
		// (pgx and lib/pq say the prepared statement "does not exist";
		// anything else, a serialization failure say, is the answer).
		if !f.end(ctx, conn, "ROLLBACK") && ctx.Err() == nil {
			return f.sessionEnded(ctx, t, fmt.Errorf("sqlfence: begin and check %v: %w", t, err))
		}
		if !strings.Contains(err.Error(), "does not exist") {
			return fmt.Errorf("sqlfence: begin and check %v: %w", t, err)
		}
		if perr := f.prepareOn(ctx, conn); perr != nil {
			return fmt.Errorf("sqlfence: begin and check %v: %w (%w)", t, err, perr)
		}
		if res, err = conn.ExecContext(ctx, msg); err != nil {
			return fmt.Errorf("sqlfence: begin and check %v: %w", t, err)
		}
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlfence: begin and check %v: %w", t, err)
	}
	if n == 1 {
		return nil
	}
	if n != 0 {
		return fmt.Errorf("sqlfence: check of %v returned %d rows", t, n)
	}
	// t is not the mark. End the transaction before reading the mark for
	// the error: marks only grow, so what is read now is at least what the
	// check saw.
	if !f.end(ctx, conn, "ROLLBACK") {
		return fmt.Errorf("sqlfence: check %v failed and the transaction could not be ended", t)
	}
	mark, _, err := f.read(ctx, conn, f.sql.current, t.Partition)
	if err != nil {
		return fmt.Errorf("sqlfence: check %v failed; read the mark: %w", t, err)
	}
	if err := ownership.Judge(t, f.signed(mark)); err != nil && (m == ownership.Exact || t.Compare(mark) < 0) {
		return err
	}
	// The mark moved between the check and the read: a fence of t itself
	// landed. Nothing ran; the caller may retry.
	return fmt.Errorf("%w: %v became the mark during the check; retry", ownership.ErrNotFenced, t)
}

// prepareOn prepares DoConn's statements on conn. It returns nil if it
// prepared one (it was missing, so running it again may succeed), and an
// error if none could be prepared: they exist already, so the failure was
// something else, or the table does not.
func (f *Fence) prepareOn(ctx context.Context, conn *sql.Conn) error {
	var errs []error
	for _, stmt := range f.sql.prepare() {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) < len(f.sql.prepare()) {
		return nil
	}
	return fmt.Errorf("prepare the check: %w", errors.Join(errs...))
}

// end sends stmt (ROLLBACK) on conn under a context that outlives the
// caller's, and reports whether it succeeded. If it fails, the connection
// is closed rather than returned to the pool in a transaction.
func (f *Fence) end(ctx context.Context, conn *sql.Conn, stmt string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if _, err := conn.ExecContext(ctx, stmt); err == nil {
		return true
	}
	_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // discards the connection
	return false
}

// checkCall rejects a call of Do or DoConn that can't run.
func (f *Fence) checkCall(t ownership.Token, m ownership.Mode, haveFn bool) error {
	if err := f.check(t); err != nil {
		return err
	}
	if m != ownership.Exact && m != ownership.Monotonic {
		return fmt.Errorf("sqlfence: unknown mode %d", m)
	}
	if !haveFn {
		return errors.New("sqlfence: nil transaction function")
	}
	return nil
}
