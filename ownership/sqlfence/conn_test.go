package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// TestDoConnLeavesNoTransaction: whatever way a DoConn ends, the
// connection goes back to the pool outside a transaction (or is closed),
// and a transaction whose statement failed never reports success. The
// pool has one connection, so the next call gets the same one, unless
// pgx found it still in a transaction and closed it: the probe is the
// server process's id.
func TestDoConnLeavesNoTransaction(t *testing.T) {
	db := openPostgres(t)
	db.SetMaxOpenConns(1)
	f := newFence(t, db, sqlfence.Postgres())
	kv := newKV(t, db, paths()[1])
	ctx := testkit.Ctx(t, 60*time.Second)
	t1, t2 := fencetest.Tok(6, 1, "a", 1), fencetest.Tok(6, 2, "b", 2)
	mustFence(t, f, t2)
	pid := func() int {
		t.Helper()
		var p int
		if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The probe sees a transaction left open.
	before := pid()
	if _, err := db.ExecContext(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if pid() == before {
		t.Fatal("the probe misses a connection left in a transaction")
	}
	boom := errors.New("boom")
	write := func(tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, kv.upsert, "k", "leaked")
		return err
	}
	for _, c := range []struct {
		name    string
		run     func() error
		want    func(error) bool
		discard bool // the connection may be closed instead
	}{
		{"stale", func() error { return f.DoConn(ctx, t1, ownership.Exact, write) },
			func(err error) bool { return errors.Is(err, ownership.ErrStaleToken) }, false},
		{"not fenced", func() error { return f.DoConn(ctx, fencetest.Tok(6, 3, "c", 3), ownership.Exact, write) },
			func(err error) bool { return errors.Is(err, ownership.ErrNotFenced) }, false},
		{"fn error", func() error {
			return f.DoConn(ctx, t2, ownership.Exact, func(tx sqlfence.Tx) error {
				if err := write(tx); err != nil {
					return err
				}
				return boom
			})
		}, func(err error) bool { return err == boom }, false},
		{"statement failed, fn says nil", func() error {
			return f.DoConn(ctx, t2, ownership.Exact, func(tx sqlfence.Tx) error {
				if err := write(tx); err != nil {
					return err
				}
				_, _ = tx.ExecContext(ctx, `SELECT 1/0`) // aborts the transaction
				return nil
			})
		}, func(err error) bool { return err != nil }, false},
		{"panic", func() (err error) {
			defer func() {
				if r := recover(); r != "fn panic" {
					err = errors.New("no panic")
				}
			}()
			return f.DoConn(ctx, t2, ownership.Exact, func(tx sqlfence.Tx) error {
				if err := write(tx); err != nil {
					return err
				}
				panic("fn panic")
			})
		}, func(err error) bool { return err == nil }, false},
		{"context ends inside fn", func() error {
			cctx, ccancel := context.WithCancel(ctx)
			return f.DoConn(cctx, t2, ownership.Exact, func(tx sqlfence.Tx) error {
				if err := write(tx); err != nil {
					return err
				}
				ccancel()
				_, err := tx.ExecContext(cctx, `SELECT pg_sleep(5)`)
				return err
			})
		}, func(err error) bool { return err != nil }, true},
	} {
		before := pid()
		if err := c.run(); !c.want(err) {
			t.Fatalf("%s: DoConn = %v", c.name, err)
		}
		if after := pid(); after != before && !c.discard {
			t.Fatalf("%s: the connection went back to the pool in a transaction", c.name)
		}
		if got := kv.get(t, "k"); got != "" {
			t.Fatalf("%s: k = %q: a failed transaction committed", c.name, got)
		}
	}
	if err := kv.put(ctx, f, t2, ownership.Exact, "k", "v"); err != nil {
		t.Fatalf("DoConn after the failures: %v", err)
	}
	if got := kv.get(t, "k"); got != "v" {
		t.Fatalf("k = %q, want v", got)
	}
}

// TestFenceDuringCheck: a fence that has changed the partition's row but
// not committed when a write's check reaches the row makes the check
// wait, and the check then sees the fence's outcome. If the fence commits,
// the write is refused without running; if it rolls back, the write goes
// ahead. The row lock and the recheck of the new row version are what
// stand between a stale holder and the data here.
func TestFenceDuringCheck(t *testing.T) {
	for _, via := range paths() {
		for _, commit := range []bool{true, false} {
			name := via.name + "/rollback"
			if commit {
				name = via.name + "/commit"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				db := openPostgres(t)
				f, table := newFenceTable(t, db, sqlfence.Postgres(), sqlfence.Config{})
				kv := newKV(t, db, via)
				ctx := testkit.Ctx(t, 60*time.Second)
				t1, t2 := fencetest.Tok(8, 1, "a", 1), fencetest.Tok(8, 2, "b", 2)
				mustFence(t, f, t1)
				// Warm the connections' statements, so the write waits in its check.
				if err := kv.put(ctx, f, t1, ownership.Exact, "warm", "x"); err != nil {
					t.Fatal(err)
				}

				fence, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer fence.Rollback()
				var pid int
				if err := fence.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				if _, err := fence.ExecContext(ctx, `UPDATE "`+table+`" SET epoch = $1, owner = $2, incarnation = '0000000000000002' WHERE partition_id = 8`, int64(t2.Epoch), t2.Owner); err != nil {
					t.Fatal(err)
				}
				ran := make(chan struct{}, 1)
				done := make(chan error, 1)
				go func() {
					done <- via.do(f, ctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
						ran <- struct{}{}
						_, err := tx.ExecContext(ctx, kv.upsert, "k", "t1")
						return err
					})
				}()
				waitBlockedBy(t, db, pid)
				if commit {
					err = fence.Commit()
				} else {
					err = fence.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				err = <-done
				if !commit {
					if err != nil || kv.get(t, "k") != "t1" {
						t.Fatalf("write after a rolled-back fence = %v, k = %q", err, kv.get(t, "k"))
					}
					return
				}
				fencetest.WantStale(t, err, t2)
				if len(ran) != 0 {
					t.Fatal("fn ran after the check waited for a fence that committed")
				}
				if got := kv.get(t, "k"); got != "" {
					t.Fatalf("k = %q: a stale write landed", got)
				}
			})
		}
	}
}

// TestMonotonicFirstWritesRace: two Monotonic writes race to be the first
// on a partition never fenced. The higher one inserts the mark and holds
// its transaction open; the lower one finds no row, tries to insert, and
// waits. Once the higher one commits, the lower one must be refused (in
// Do, by its second look at the row after its insert lost) and must not
// commit.
func TestMonotonicFirstWritesRace(t *testing.T) {
	for _, via := range paths() {
		t.Run(via.name, func(t *testing.T) {
			t.Parallel()
			db := openPostgres(t)
			f := newFence(t, db, sqlfence.Postgres())
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			low, high := fencetest.Tok(9, 1, "a", 1), fencetest.Tok(9, 2, "b", 2)
			// Warm the connections' statements on another partition.
			if err := kv.put(ctx, f, fencetest.Tok(10, 1, "w", 1), ownership.Monotonic, "warm", "x"); err != nil {
				t.Fatal(err)
			}

			pids, release := make(chan int, 1), make(chan struct{})
			highDone := make(chan error, 1)
			go func() {
				highDone <- via.do(f, ctx, high, ownership.Monotonic, func(tx sqlfence.Tx) error {
					var pid int
					if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, kv.upsert, "k", "high"); err != nil {
						return err
					}
					pids <- pid
					<-release
					return nil
				})
			}()
			var pid int
			select {
			case pid = <-pids:
			case err := <-highDone:
				t.Fatalf("the higher write ended early: %v", err)
			}
			lowDone := make(chan error, 1)
			go func() { lowDone <- kv.put(ctx, f, low, ownership.Monotonic, "k", "low") }()
			waitBlockedBy(t, db, pid)
			close(release)
			if err := <-highDone; err != nil {
				t.Fatalf("higher write: %v", err)
			}
			fencetest.WantStale(t, <-lowDone, high)
			if got := kv.get(t, "k"); got != "high" {
				t.Fatalf("k = %q: the lower write landed after the higher one", got)
			}
			if cur, _ := f.Current(ctx, 9); !cur.Same(high) {
				t.Fatalf("mark = %v, want %v", cur, high)
			}
		})
	}
}

// waitBlockedBy polls until some PostgreSQL backend waits for a lock that
// backend pid holds.
func waitBlockedBy(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	pollRows(t, db, fmt.Sprintf("a backend waiting for backend %d", pid),
		`SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid)
}

// TestDoConnTwoTables: the check prepared for one fence table is never
// run for another, on the same connection.
func TestDoConnTwoTables(t *testing.T) {
	db := openPostgres(t)
	db.SetMaxOpenConns(1)
	a, b := newFence(t, db, sqlfence.Postgres()), newFence(t, db, sqlfence.Postgres())
	kv := newKV(t, db, paths()[1])
	ctx := testkit.Ctx(t, 60*time.Second)
	t1, t2 := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(1, 2, "b", 2)
	mustFence(t, a, t1)
	mustFence(t, b, t1)
	mustFence(t, b, t2)
	if err := kv.put(ctx, a, t1, ownership.Exact, "k", "a"); err != nil {
		t.Fatalf("write to a under its mark: %v", err)
	}
	fencetest.WantStale(t, kv.put(ctx, b, t1, ownership.Exact, "k", "b"), t2)
	if err := kv.put(ctx, b, t2, ownership.Exact, "k", "b"); err != nil {
		t.Fatalf("write to b under its mark: %v", err)
	}
}

// TestDoConnOwnerNames: owner names go into DoConn's message as literals;
// names with quotes, backslashes, semicolons and non-ASCII letters are
// checked as the bytes they are, and none is read as SQL.
func TestDoConnOwnerNames(t *testing.T) {
	db := openPostgres(t)
	f := newFence(t, db, sqlfence.Postgres())
	kv := newKV(t, db, paths()[1])
	ctx := testkit.Ctx(t, 60*time.Second)
	owners := []string{"", "node-1", "a'b", `a\'b`, `\`, "x'); SELECT pg_sleep(60); --", "é", "日本", "a b", "a\x01", "$$", "node_1.2:3/4@5"}
	for i, o := range owners {
		p := uint32(100 + i)
		for _, m := range []ownership.Mode{ownership.Exact, ownership.Monotonic} {
			tk := fencetest.Tok(p, uint64(2+m), o, 7)
			mustFence(t, f, tk)
			if err := kv.put(ctx, f, tk, m, "k", o); err != nil {
				t.Fatalf("%s write under owner %q: %v", m, o, err)
			}
			// The same epoch and incarnation under a name one byte off is
			// another token.
			other := tk
			other.Owner = o + "x"
			if err := kv.put(ctx, f, other, ownership.Exact, "k", "other"); err == nil {
				t.Fatalf("write under owner %q passed the check of %q", other.Owner, o)
			}
			// So is the same owner and incarnation in the previous epoch.
			if m == ownership.Monotonic {
				prev := tk
				prev.Epoch--
				fencetest.WantStale(t, kv.put(ctx, f, prev, ownership.Exact, "k", "prev"), tk)
			}
		}
	}
}
