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
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A session the server ends for idle_in_transaction_session_timeout (set
// for pgx as a run-time parameter, as the package doc says) looks to fn
// like a failed statement: the driver's error, neither a stale token nor
// an unknown outcome. Nothing commits, and the partition is free at once:
// a new owner's Fence does not wait for the holder.
func TestKilledSessionRollsBack(t *testing.T) {
	ctx, cancel := testContext(t)
	defer cancel()
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
	old := tok(2, 1, "a", 1)
	if _, err := f.Fence(ctx, old); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			var fnErr error
			err := p.do(fk, ctx, old, ownership.Exact, func(tx sqlfence.Tx) error {
				var pid int64
				if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (1)`); err != nil {
					return err
				}
				// Idle in the transaction until the server ends the session.
				pollUntil(t, "the session ended by the server", func() bool {
					var n int
					err := direct.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
					return err == nil && n == 0
				})
				_, fnErr = tx.ExecContext(ctx, `INSERT INTO "`+effects+`" (v) VALUES (2)`)
				return fnErr
			})
			if fnErr == nil || !errors.Is(err, fnErr) {
				t.Fatalf("Do = %v, want fn's error %v", err, fnErr)
			}
			if errors.Is(err, ownership.ErrStaleToken) || errors.Is(err, ownership.ErrOutcomeUnknown) {
				t.Errorf("a killed session reads as %v, want the driver's error only", err)
			}
			t.Logf("a killed session looks like: %v", err)
			var n int
			if err := direct.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+effects+`"`).Scan(&n); err != nil || n != 0 {
				t.Errorf("%d rows committed by the killed session (%v), want 0", n, err)
			}
			// The lock went with the session.
			fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
			defer fcancel()
			if err := f.Do(fctx, old, ownership.Exact, func(*sql.Tx) error { return nil }); err != nil {
				t.Errorf("the partition after the killed session: %v", err)
			}
		})
	}
}
