package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A COMMIT that fails leaves the outcome unknown: Do's error wraps
// ownership.ErrOutcomeUnknown and no context error, so a guard can't take
// it for a cancelled write and retry it. The commit here fails for sure (a
// deferred foreign key is checked at COMMIT), but Do can't tell that from a
// commit whose answer was lost, and must not guess.
func TestCommitErrorIsOutcomeUnknown(t *testing.T) {
	for b, via := range everyPath() {
		t.Run(b.name+"/"+via.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			db := b.open(t)
			if b.name == "sqlite" {
				// Foreign keys are a per-connection setting in SQLite: on
				// for every connection of this handle.
				var err error
				db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "fk.db")+
					"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			}
			f := newFence(t, db, b.dialect)
			parent, child := uniqueName(t, db, "parent"), uniqueName(t, db, "child")
			for _, stmt := range []string{
				`CREATE TABLE "` + parent + `" (id BIGINT PRIMARY KEY)`,
				`CREATE TABLE "` + child + `" (id BIGINT REFERENCES "` + parent + `" (id) DEFERRABLE INITIALLY DEFERRED)`,
			} {
				if _, err := db.ExecContext(ctx, stmt); err != nil {
					t.Fatal(err)
				}
			}
			t1 := fencetest.Tok(1, 1, "a", 1)
			if _, err := f.Fence(ctx, t1); err != nil {
				t.Fatal(err)
			}
			err := via.do(f, ctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO "`+child+`" (id) VALUES (7)`) // no parent 7
				return err
			})
			if !errors.Is(err, ownership.ErrOutcomeUnknown) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Do with a failing COMMIT = %v; want ErrOutcomeUnknown without a context error", err)
			}
		})
	}
}

// A transaction whose context ends before Do commits is not committed, and
// says so with the context's error (not ErrOutcomeUnknown): nothing was
// applied, so a retry is safe.
func TestCancelBeforeCommitAppliesNothing(t *testing.T) {
	for b, via := range everyPath() {
		t.Run(b.name+"/"+via.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			table := uniqueName(t, db, "data")
			if _, err := db.ExecContext(ctx, `CREATE TABLE "`+table+`" (id BIGINT)`); err != nil {
				t.Fatal(err)
			}
			t1 := fencetest.Tok(1, 1, "a", 1)
			if _, err := f.Fence(ctx, t1); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithCancel(ctx)
			err := via.do(f, wctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
				if _, err := tx.ExecContext(wctx, `INSERT INTO "`+table+`" (id) VALUES (1)`); err != nil {
					return err
				}
				wcancel() // the lease ends as fn returns
				return nil
			})
			if !errors.Is(err, context.Canceled) || errors.Is(err, ownership.ErrOutcomeUnknown) {
				t.Fatalf("Do cancelled before COMMIT = %v; want context.Canceled, not ErrOutcomeUnknown", err)
			}
			var n int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+table+`"`).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows after a cancelled Do: %d, %v; want 0", n, err)
			}
		})
	}
}
