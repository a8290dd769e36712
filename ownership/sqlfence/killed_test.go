package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A session the server ends for idle_in_transaction_session_timeout (set
// for pgx as a run-time parameter, as the package doc says) before the
// commit reaches the caller classified: an error wrapping ErrSessionEnded
// and fn's error, neither a stale token (the lease is still live) nor an
// unknown outcome. Nothing commits, and the partition is free at once: a
// new owner's Fence does not wait for the holder. (Before ErrSessionEnded,
// Do returned the driver's error alone.)
func TestKilledSessionRollsBack(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	b := backends()[1]
	direct := b.open(t)
	f, table := newFenceTable(t, direct, b.dialect, sqlfence.Config{})
	effects := uniqueName(t, direct, "tenure_killed")
	if _, err := direct.ExecContext(ctx, `CREATE TABLE "`+effects+`" (v BIGINT)`); err != nil {
		t.Fatal(err)
	}
	dsn, _ := testdb.PostgresDSN()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "200ms"
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	fk, err := sqlfence.New(db, b.dialect, sqlfence.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer fk.Close()
	old := fencetest.Tok(2, 1, "a", 1)
	if _, err := f.Fence(ctx, old); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			var fnErr error
			err := p.do(fk, ctx, old, ownership.Exact, func(tx sqlfence.Tx) error {
				pid := backendPID(t, ctx, tx)
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (1)`); err != nil {
					return err
				}
				// Idle in the transaction until the server ends the session.
				waitGone(t, ctx, direct, pid)
				_, fnErr = tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (2)`)
				return fnErr
			})
			if fnErr == nil || !errors.Is(err, fnErr) || !errors.Is(err, sqlfence.ErrSessionEnded) {
				t.Fatalf("Do = %v, want ErrSessionEnded and fn's error %v", err, fnErr)
			}
			if errors.Is(err, ownership.ErrStaleToken) || errors.Is(err, ownership.ErrOutcomeUnknown) {
				t.Errorf("a killed session of a live lease reads as %v, want neither a stale token nor an unknown outcome", err)
			}
			var se *sqlfence.SessionEndedError
			if !errors.As(err, &se) || se.Token != old {
				t.Errorf("Do = %v, want a *SessionEndedError of %v", err, old)
			}
			t.Logf("a killed session looks like: %v", err)
			wantRows(t, ctx, direct, effects, 0)
			// The lock went with the session.
			fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
			defer fcancel()
			if err := f.Do(fctx, old, ownership.Exact, func(*sql.Tx) error { return nil }); err != nil {
				t.Errorf("the partition after the killed session: %v", err)
			}
		})
	}
}

// A session ended by pg_terminate_backend in the middle of the
// transaction, while a new owner fenced the partition (a paused owner's),
// reads as ErrSessionEnded and a stale token carrying the new mark: the
// lease is over. Ended during the commit, the outcome is unknown
// (ownership.ErrOutcomeUnknown), never ErrSessionEnded: the commit may
// have landed (here it did not).
func TestTerminatedSessionClassified(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	b := backends()[1]
	direct := b.open(t)
	f, _ := newFenceTable(t, direct, b.dialect, sqlfence.Config{})
	effects := uniqueName(t, direct, "tenure_terminated")
	if _, err := direct.ExecContext(ctx, `CREATE TABLE "`+effects+`" (v BIGINT)`); err != nil {
		t.Fatal(err)
	}
	// terminate ends tx's session from another connection and waits until
	// it is gone.
	terminate := func(t *testing.T, tx sqlfence.Tx) {
		pid := backendPID(t, ctx, tx)
		if _, err := direct.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		waitGone(t, ctx, direct, pid)
	}
	epoch := uint64(0)
	for _, p := range paths() {
		t.Run(p.name+"/mid-transaction", func(t *testing.T) {
			epoch += 2
			old, next := fencetest.Tok(3, epoch, "a", 1), fencetest.Tok(3, epoch+1, "b", 1)
			if _, err := f.Fence(ctx, old); err != nil {
				t.Fatal(err)
			}
			var fnErr error
			err := p.do(f, ctx, old, ownership.Exact, func(tx sqlfence.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (1)`); err != nil {
					return err
				}
				terminate(t, tx)
				if _, err := f.Fence(ctx, next); err != nil { // the lock went with the session
					t.Errorf("fence %v: %v", next, err)
				}
				_, fnErr = tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (2)`)
				return fnErr
			})
			if fnErr == nil || !errors.Is(err, fnErr) || !errors.Is(err, sqlfence.ErrSessionEnded) || errors.Is(err, ownership.ErrOutcomeUnknown) {
				t.Fatalf("Do = %v, want ErrSessionEnded and fn's error %v, not an unknown outcome", err, fnErr)
			}
			fencetest.WantStale(t, err, next)
			t.Logf("a terminated session of a lost lease looks like: %v", err)
			wantRows(t, ctx, direct, effects, 0)
		})
		t.Run(p.name+"/at-commit", func(t *testing.T) {
			epoch += 2
			owner := fencetest.Tok(3, epoch, "a", 1)
			if _, err := f.Fence(ctx, owner); err != nil {
				t.Fatal(err)
			}
			err := p.do(f, ctx, owner, ownership.Exact, func(tx sqlfence.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (1)`); err != nil {
					return err
				}
				terminate(t, tx) // fn returns nil: the commit finds the session gone
				return nil
			})
			if !errors.Is(err, ownership.ErrOutcomeUnknown) || errors.Is(err, sqlfence.ErrSessionEnded) {
				t.Fatalf("Do = %v, want an unknown outcome and not ErrSessionEnded", err)
			}
			t.Logf("a session terminated at the commit looks like: %v", err)
			wantRows(t, ctx, direct, effects, 0)
		})
	}
}

// backendPID returns the PostgreSQL backend of tx's session.
func backendPID(t *testing.T, ctx context.Context, tx sqlfence.Tx) int64 {
	t.Helper()
	var pid int64
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits until backend pid has ended.
func waitGone(t *testing.T, ctx context.Context, db *sql.DB, pid int64) {
	t.Helper()
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the session ended by the server", func() bool {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	})
}

// wantRows fails unless table holds n rows.
func wantRows(t *testing.T, ctx context.Context, db *sql.DB, table string, n int) {
	t.Helper()
	var got int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+table+`"`).Scan(&got); err != nil || got != n {
		t.Errorf("%d rows committed (%v), want %d", got, err, n)
	}
}
