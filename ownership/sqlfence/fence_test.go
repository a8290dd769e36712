package sqlfence_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// TestFenceOrder checks that the database orders tokens exactly as
// Token.Compare does: owner names bytewise (not by the server's locale),
// incarnations as unsigned numbers.
func TestFenceOrder(t *testing.T) {
	owners := []string{"", "A", "Z", "a", "ab", "b", "node-1", "node-10", "node-2", "z", "é", "ü", "ß", "日本", "a b", "a\x01"}
	incs := []uint64{0, 1, 0xff, 1 << 62, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64}
	var toks []ownership.Token
	for _, e := range []uint64{1, 2, 255, 256, math.MaxInt64} {
		for _, o := range owners {
			for _, i := range incs {
				toks = append(toks, fencetest.Tok(0, e, o, i))
			}
		}
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{})
			ctx := testkit.Ctx(t, 60*time.Second)
			rng := rand.New(rand.NewPCG(1, 2))
			checkOrder := func(from uint32) {
				t.Helper()
				for p := from; p < from+150; p++ {
					x, y := toks[rng.IntN(len(toks))], toks[rng.IntN(len(toks))]
					if p%150 < 20 { // same epoch, or same epoch and owner: the hard cases
						y.Epoch = x.Epoch
						if p%150 < 10 {
							y.Owner = x.Owner
						}
					}
					x.Partition, y.Partition = p, p
					if _, err := f.Fence(ctx, x); err != nil {
						t.Fatalf("Fence(%v) on a fresh partition: %v", x, err)
					}
					mark, err := f.Fence(ctx, y)
					switch c := y.Compare(x); {
					case c < 0:
						fencetest.WantStale(t, err, x)
					case err != nil:
						t.Fatalf("Fence(%v) after %v: %v", y, x, err)
					case !mark.Same(y):
						t.Fatalf("Fence(%v) after %v = %v", y, x, mark)
					}
				}
			}
			checkOrder(0)
			if b.name != "postgres" {
				return
			}
			// The server's default collation may order text by locale; the
			// table must not.
			var coll string
			if err := db.QueryRowContext(ctx, `SELECT collation_name FROM information_schema.columns
				WHERE table_name = $1 AND column_name = 'owner'`, table).Scan(&coll); err != nil || coll != "C" {
				t.Fatalf("owner column collation = %q, %v; want C", coll, err)
			}
			// Nor may the statements rely on the column's collation: give it
			// a locale's, where "Z" > "a", and check the order again.
			var icu bool
			if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'en-x-icu')`).Scan(&icu); err != nil {
				t.Fatal(err)
			}
			if icu {
				if _, err := db.ExecContext(ctx, `ALTER TABLE "`+table+`" ALTER COLUMN owner TYPE TEXT COLLATE "en-x-icu"`); err != nil {
					t.Fatal(err)
				}
				// New connections: the old ones cached plans for the old type.
				fresh, err := sqlfence.New(b.open(t), b.dialect, sqlfence.Config{Table: table})
				if err != nil {
					t.Fatal(err)
				}
				f = fresh
				checkOrder(1000)
			}
		})
	}
}

// TestDoMonotonicRollback: a higher Monotonic write that rolls back
// leaves the mark alone, and a fenced transaction leaves no connection in
// use. (Exact and Monotonic themselves are in the contract suite,
// TestContract.)
func TestDoMonotonicRollback(t *testing.T) {
	for b, via := range everyPath() {
		t.Run(b.name+"/"+via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t2, t3 := fencetest.Tok(4, 2, "b", 2), fencetest.Tok(4, 3, "c", 3)
			if err := kv.put(ctx, f, t2, ownership.Monotonic, "k", "v2"); err != nil {
				t.Fatalf("first monotonic write: %v", err)
			}
			boom := errors.New("boom")
			err := via.do(f, ctx, t3, ownership.Monotonic, func(tx sqlfence.Tx) error {
				if _, err := tx.ExecContext(ctx, kv.upsert, "k", "rolled back"); err != nil {
					return err
				}
				return boom
			})
			if err != boom {
				t.Fatalf("Do returned %v, want fn's error unchanged", err)
			}
			if cur, _ := f.Current(ctx, 4); !cur.Same(t2) {
				t.Fatalf("rolled-back write moved the mark to %v", cur)
			}
			if got := kv.get(t, "k"); got != "v2" {
				t.Fatalf("k = %q, want v2", got)
			}
			if n := db.Stats().InUse; n != 0 {
				t.Fatalf("%d connections still in use", n)
			}
		})
	}
}

func TestDoRollsBack(t *testing.T) {
	for b, via := range everyPath() {
		t.Run(b.name+"/"+via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1 := fencetest.Tok(1, 1, "a", 1)
			mustFence(t, f, t1)

			boom := errors.New("boom")
			err := via.do(f, ctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
				if _, err := tx.ExecContext(ctx, kv.upsert, "k", "no"); err != nil {
					return err
				}
				return fmt.Errorf("wrapped: %w", boom)
			})
			if !errors.Is(err, boom) {
				t.Fatalf("Do = %v, want fn's error", err)
			}
			func() {
				defer func() {
					if r := recover(); r != "fn panic" {
						t.Fatalf("recovered %v, want fn's panic", r)
					}
				}()
				_ = via.do(f, ctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
					if _, err := tx.ExecContext(ctx, kv.upsert, "k", "no"); err != nil {
						return err
					}
					panic("fn panic")
				})
			}()
			if got := kv.get(t, "k"); got != "" {
				t.Fatalf("k = %q after rolled back writes", got)
			}
			if n := db.Stats().InUse; n != 0 {
				t.Fatalf("%d connections still in use: a transaction leaked", n)
			}
			// A cancelled context fails cleanly too.
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if err := kv.put(cctx, f, t1, ownership.Exact, "k", "no"); !errors.Is(err, context.Canceled) {
				t.Fatalf("Do with a cancelled context = %v", err)
			}
			// And the fence still works afterwards.
			if err := kv.put(ctx, f, t1, ownership.Exact, "k", "yes"); err != nil {
				t.Fatalf("write after rollbacks: %v", err)
			}
			if got := kv.get(t, "k"); got != "yes" {
				t.Fatalf("k = %q, want yes", got)
			}
		})
	}
}

// TestFenceWaitsForDo: a fence that lands while a write holds the partition
// waits for the write's commit, and the write commits; with
// Config.Concurrent (a shared lock) too.
func TestFenceWaitsForDo(t *testing.T) {
	for b, via := range everyPath() {
		for _, conc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s/concurrent=%v", b.name, via.name, conc), func(t *testing.T) {
				t.Parallel()
				fenceWaitsForDo(t, b, via, conc)
			})
		}
	}
}

func fenceWaitsForDo(t *testing.T, b backend, via path, conc bool) {
	db := b.open(t)
	f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: conc})
	kv := newKV(t, db, via)
	ctx := testkit.Ctx(t, 60*time.Second)
	t1, t2 := fencetest.Tok(2, 1, "a", 1), fencetest.Tok(2, 2, "b", 2)
	mustFence(t, f, t1)

	h := hold(t, ctx, f, via, kv, t1, "k", "t1")
	h.held(t)
	fenced := fenceAsync(ctx, f, t2)
	if b.name == "postgres" {
		waitForLockWait(t, db, table)
	}
	select {
	case err := <-fenced:
		t.Fatalf("Fence returned (%v) while a write held the partition", err)
	case <-time.After(200 * time.Millisecond):
	}
	h.end(t)
	if err := <-fenced; err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if got := kv.get(t, "k"); got != "t1" {
		t.Fatalf("k = %q, want t1", got)
	}
	fencetest.WantStale(t, kv.put(ctx, f, t1, ownership.Exact, "k", "late"), t2)
}

// waitForLockWait polls until a PostgreSQL backend waits for a lock in a
// statement on table.
func waitForLockWait(t *testing.T, db *sql.DB, table string) {
	t.Helper()
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "a backend waiting for the partition's row lock", func() bool { return lockWaiters(t, db, table, "", "") > 0 })
}

// lockWaiters counts the PostgreSQL backends waiting for a lock (whose
// wait event is event, unless it is "") in a statement that names table,
// or that runs DoConn's statement kind ("check", "raise"; "" for none),
// prepared under a name made from the table's.
func lockWaiters(t *testing.T, db *sql.DB, table, event, kind string) int {
	t.Helper()
	prepared := ""
	if kind != "" {
		sum := sha256.Sum256([]byte(`"` + table + `"`))
		prepared = "tenure_" + kind + "_" + hex.EncodeToString(sum[:12])
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND ($1 = '' OR wait_event = $1) AND datname = current_database()
		AND (strpos(query, $2) > 0 OR ($3 <> '' AND strpos(query, $3) > 0))`, event, table, prepared).Scan(&n); err != nil {
		t.Fatalf("count the backends waiting for a lock on %s: %v", table, err)
	}
	return n
}

// gateWaiter waits, for at most 20 s, for a backend waiting for an
// advisory lock that blocker's backend holds or is ahead of it in the
// queue for (pg_blocking_pids names both), and returns its pid.
func gateWaiter(t *testing.T, db *sql.DB, what string, blocker int) int {
	t.Helper()
	var pid int
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, what, func() bool {
		err := db.QueryRow(`SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND $1 = ANY(pg_blocking_pids(pid))
			LIMIT 1`, blocker).Scan(&pid)
		if err == sql.ErrNoRows {
			return false
		}
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		return true
	})
	return pid
}

// pollRows polls until query, a count, returns more than zero, for at
// most 20 s.
func pollRows(t *testing.T, db *sql.DB, what, query string, args ...any) {
	t.Helper()
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, what, func() bool {
		var n int
		if err := db.QueryRow(query, args...).Scan(&n); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		return n > 0
	})
}

// TestAuthorityClaimsAboveInt32: a claim above an epoch past 2^31 (a mark
// fenced from gossip's epochs, or the jump after a table reset). On
// PostgreSQL the claim's "$4 + 1" made the server type $4 an integer, and
// every such claim failed to encode its argument.
func TestAuthorityClaimsAboveInt32(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			ctx := testkit.Ctx(t, 60*time.Second)
			seen := fencetest.Tok(9, 1<<40, "a", 1)
			mustFence(t, f, seen)
			got, err := f.Authority().Claim(ctx, 9, ownership.Node{Name: "b", Incarnation: 2}, seen)
			if err != nil || !got.Same(fencetest.Tok(9, 1<<40+1, "b", 2)) {
				t.Fatalf("claim above epoch 2^40 = %v, %v", got, err)
			}
		})
	}
}

// TestAuthorityUsageErrors: a claim by a node without a name or with a
// NUL in it, or from a token of another partition or an epoch the table
// can't raise, is a usage error, never a conflict, and changes nothing.
// (The claims themselves are in the contract suite, TestContract.)
func TestAuthorityUsageErrors(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			a := f.Authority()
			ctx := testkit.Ctx(t, 60*time.Second)
			na := ownership.Node{Name: "a", Incarnation: 1 << 63}
			tb, err := a.Claim(ctx, 9, na, ownership.Token{})
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range []struct {
				n    ownership.Node
				seen ownership.Token
			}{
				{ownership.Node{}, tb},
				{ownership.Node{Name: "a\x00b"}, tb},
				{na, fencetest.Tok(8, 2, "b", 5)},
				{na, fencetest.Tok(9, math.MaxInt64, "b", 5)},
			} {
				if got, err := a.Claim(ctx, 9, bad.n, bad.seen); err == nil || errors.Is(err, ownership.ErrConflict) {
					t.Fatalf("Claim(%v, %v) = %v, %v; want a usage error", bad.n, bad.seen, got, err)
				}
			}
			if cur, _ := f.Current(ctx, 9); !cur.Same(tb) {
				t.Fatalf("mark = %v, want %v", cur, tb)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	db := openSQLite(t)
	if _, err := sqlfence.New(nil, sqlfence.SQLite(), sqlfence.Config{}); err == nil {
		t.Error("New with a nil db succeeded")
	}
	if _, err := sqlfence.New(db, sqlfence.Dialect{}, sqlfence.Config{}); err == nil {
		t.Error("New with the zero Dialect succeeded")
	}
	for _, name := range []string{"", "t", "T_1", "public.tenure", "_x"} {
		if err := (sqlfence.Config{Table: name}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", name, err)
		}
	}
	for _, name := range []string{"1t", "a-b", `a"b`, "a.b.c", "a.", ".a", "t; DROP TABLE x", strings.Repeat("x", 64), "é"} {
		cfg := sqlfence.Config{Table: name}
		if err := cfg.Validate(); err == nil {
			t.Errorf("Validate(%q) succeeded", name)
		}
		if _, err := sqlfence.New(db, sqlfence.SQLite(), cfg); err == nil {
			t.Errorf("New with table %q succeeded", name)
		}
	}
	f := newFence(t, db, sqlfence.SQLite())
	ctx := testkit.Ctx(t, 60*time.Second)
	noop := func(sqlfence.Tx) error { return nil }
	for _, via := range paths() {
		for _, bad := range []ownership.Token{
			{},
			fencetest.Tok(1, 0, "a", 1),
			fencetest.Tok(1, 1<<63, "a", 1),
			fencetest.Tok(1, 1, "a\x00", 1),
			fencetest.Tok(1, 1, "\xff", 1),
		} {
			if _, err := f.Fence(ctx, bad); err == nil {
				t.Errorf("Fence(%v) succeeded", bad)
			}
			if err := via.do(f, ctx, bad, ownership.Monotonic, noop); err == nil {
				t.Errorf("%s(%v) succeeded", via.name, bad)
			}
		}
		if err := via.do(f, ctx, fencetest.Tok(1, 0, "a", 1), ownership.Monotonic, noop); err == nil || !strings.Contains(err.Error(), "epoch 0") {
			t.Errorf("%s with epoch 0 = %v, want an error naming epoch 0", via.name, err)
		}
		good := fencetest.Tok(1, 1, "a", 1)
		if err := via.do(f, ctx, good, ownership.Mode(9), noop); err == nil {
			t.Errorf("%s with an unknown mode succeeded", via.name)
		}
		if err := via.do(f, ctx, good, ownership.Monotonic, nil); err == nil {
			t.Errorf("%s with a nil fn succeeded", via.name)
		}
	}
	if cur, _ := f.Current(ctx, 1); !cur.IsZero() {
		t.Errorf("rejected calls fenced %v", cur)
	}
	if got := sqlfence.SQLite().String() + " " + sqlfence.Postgres().String(); got != "sqlite postgres" {
		t.Errorf("dialect names %q", got)
	}
}

// TestPrepareAndClose: Do before the table exists fails and succeeds once
// it does; after Close the fence keeps working.
func TestPrepareAndClose(t *testing.T) {
	for b, via := range everyPath() {
		t.Run(b.name+"/"+via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, err := sqlfence.New(db, b.dialect, sqlfence.Config{Table: uniqueName(t, db, "tenure_fence")})
			if err != nil {
				t.Fatal(err)
			}
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1 := fencetest.Tok(1, 1, "a", 1)
			if err := kv.put(ctx, f, t1, ownership.Exact, "k", "v"); err == nil {
				t.Fatal("Do before CreateSchema succeeded")
			}
			if err := f.CreateSchema(ctx); err != nil {
				t.Fatal(err)
			}
			if err := f.CreateSchema(ctx); err != nil {
				t.Fatalf("second CreateSchema: %v", err)
			}
			mustFence(t, f, t1)
			if err := kv.put(ctx, f, t1, ownership.Exact, "k", "v1"); err != nil {
				t.Fatalf("Do after CreateSchema: %v", err)
			}
			for range 2 {
				if err := f.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			if err := kv.put(ctx, f, t1, ownership.Exact, "k", "v2"); err != nil {
				t.Fatalf("Do after Close: %v", err)
			}
			t2 := fencetest.Tok(1, 2, "b", 1)
			mustFence(t, f, t2)
			fencetest.WantStale(t, kv.put(ctx, f, t1, ownership.Exact, "k", "late"), t2)
			if got := kv.get(t, "k"); got != "v2" {
				t.Fatalf("k = %q, want v2", got)
			}
		})
	}
}

func mustFence(t *testing.T, f *sqlfence.Fence, tk ownership.Token) {
	t.Helper()
	ctx := testkit.Ctx(t, 60*time.Second)
	if got, err := f.Fence(ctx, tk); err != nil || !got.Same(tk) {
		t.Fatalf("Fence(%v) = %v, %v", tk, got, err)
	}
}

// kv is a key/value table the tests write through the fence.
type kv struct {
	db     *sql.DB
	via    path // how put runs its transaction
	table  string
	upsert string
}

func newKV(t testing.TB, db *sql.DB, via path) *kv {
	t.Helper()
	name := uniqueName(t, db, "tenure_kv")
	ctx := testkit.Ctx(t, 60*time.Second)
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+name+`" (k TEXT PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		t.Fatalf("create kv table: %v", err)
	}
	return &kv{db: db, table: name, via: via,
		upsert: `INSERT INTO "` + name + `" (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`}
}

func (s *kv) put(ctx context.Context, f *sqlfence.Fence, tk ownership.Token, m ownership.Mode, k, v string) error {
	return s.via.do(f, ctx, tk, m, func(tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, s.upsert, k, v)
		return err
	})
}

func (s *kv) get(t *testing.T, k string) string {
	t.Helper()
	var v string
	err := s.db.QueryRow(`SELECT v FROM "`+s.table+`" WHERE k = $1`, k).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("get %q: %v", k, err)
	}
	return v
}

// fenceAsync runs f.Fence(ctx, tok) in the background; its error comes
// on the channel.
func fenceAsync(ctx context.Context, f *sqlfence.Fence, tok ownership.Token) <-chan error {
	fenced := make(chan error, 1)
	go func() {
		_, err := f.Fence(ctx, tok)
		fenced <- err
	}()
	return fenced
}

// holder runs one fenced write of key (value v) under tok in the
// background and holds the transaction open until released.
// A test that fails while h holds releases it as it ends.
type holder struct {
	holding chan struct{} // closed once the write ran and fn waits
	release func()
	wait    chan struct{}
	done    chan error
}

func hold(t *testing.T, ctx context.Context, f *sqlfence.Fence, via path, kv *kv, tok ownership.Token, key, v string) *holder {
	wait := make(chan struct{})
	h := &holder{holding: make(chan struct{}), wait: wait, release: sync.OnceFunc(func() { close(wait) }), done: make(chan error, 1)}
	t.Cleanup(h.release)
	go func() {
		h.done <- via.do(f, ctx, tok, ownership.Exact, func(tx sqlfence.Tx) error {
			if _, err := tx.ExecContext(ctx, kv.upsert, key, v); err != nil {
				return err
			}
			close(h.holding)
			<-h.wait
			return nil
		})
	}()
	return h
}

// held waits until h holds its transaction open; it fails the test if h
// ended first, or after 20 s.
func (h *holder) held(t *testing.T) {
	t.Helper()
	select {
	case <-h.holding:
	case err := <-h.done:
		t.Fatalf("the write ended early: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the write did not run within 20 s")
	}
}

// end releases h and fails the test if its write failed.
func (h *holder) end(t *testing.T) {
	t.Helper()
	h.release()
	if err := <-h.done; err != nil {
		t.Fatalf("the write that held the partition: %v", err)
	}
}

// TestConcurrentDo: with Config.Concurrent, two fenced transactions of one
// partition under the mark run side by side on PostgreSQL, and a fence
// waits for both; without it (the control), the second waits for the
// first. SQLite has one writer and ignores Concurrent (not run here: its
// second writer waits whatever the setting).
func TestConcurrentDo(t *testing.T) {
	b := backends()[1]
	for _, via := range paths() {
		t.Run(via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: true})
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1, t2 := fencetest.Tok(3, 1, "a", 1), fencetest.Tok(3, 2, "b", 2)
			mustFence(t, f, t1)

			first := hold(t, ctx, f, via, kv, t1, "k1", "v")
			first.held(t)
			second := hold(t, ctx, f, via, kv, t1, "k2", "v")
			second.held(t) // ran beside the first: it did not wait for it

			fenced := fenceAsync(ctx, f, t2)
			// The fence waits for both writes; it must not return first.
			testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the fence waiting for the writes", func() bool {
				select {
				case err := <-fenced:
					t.Fatalf("Fence returned (%v) while two writes held the partition", err)
				default:
				}
				return lockWaiters(t, db, table, "", "") > 0
			})
			first.end(t)
			select {
			case err := <-fenced:
				t.Fatalf("Fence returned (%v) while the second write held the partition", err)
			default:
			}
			second.end(t)
			if err := <-fenced; err != nil {
				t.Fatalf("Fence: %v", err)
			}
			if kv.get(t, "k1") != "v" || kv.get(t, "k2") != "v" {
				t.Fatal("a write that held the partition under the mark did not commit")
			}
			fencetest.WantStale(t, kv.put(ctx, f, t1, ownership.Exact, "k1", "late"), t2)
		})
		t.Run(via.name+"/control", func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{})
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1 := fencetest.Tok(3, 1, "a", 1)
			mustFence(t, f, t1)
			first := hold(t, ctx, f, via, kv, t1, "k1", "v")
			first.held(t)
			second := hold(t, ctx, f, via, kv, t1, "k2", "v")
			// The second waits for the first.
			testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "a check waiting for the partition's row lock", func() bool { return lockWaiters(t, db, table, "", "check") > 0 })
			select {
			case <-second.holding:
				t.Fatal("the second write ran beside the first without Concurrent")
			default:
			}
			first.end(t)
			second.held(t)
			second.end(t)
		})
	}
}

// TestFenceNotStarvedByConcurrentWriters: on a Concurrent fence, writers
// that keep sharing the partition's lock, each transaction overlapping the
// next, do not hold a fence or a claim off: the fence queues new sharers
// behind it. Before the advisory gate a fence waited here for as long as
// the writers kept writing, and, with the gate keyed on the table's name,
// so did a fence that names the table with its schema.
func TestFenceNotStarvedByConcurrentWriters(t *testing.T) {
	b := backends()[1]
	for _, via := range paths() {
		t.Run(via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: true})
			qualified, err := sqlfence.New(db, b.dialect, sqlfence.Config{Table: "public." + table})
			if err != nil {
				t.Fatal(err)
			}
			defer qualified.Close()
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1, t2, t3 := fencetest.Tok(4, 1, "a", 1), fencetest.Tok(4, 2, "b", 2), fencetest.Tok(4, 4, "d", 4)
			mustFence(t, f, t1)

			// under runs writers under tk until took returns, then stops them.
			under := func(tk ownership.Token, writers int, took func() error) {
				t.Helper()
				var (
					wg      sync.WaitGroup
					stop    = make(chan struct{})
					written atomic.Int64
				)
				for i := range writers {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							err := via.do(f, ctx, tk, ownership.Exact, func(tx sqlfence.Tx) error {
								if _, err := tx.ExecContext(ctx, kv.upsert, fmt.Sprintf("k%d", i), "v"); err != nil {
									return err
								}
								_, err := tx.ExecContext(ctx, `SELECT pg_sleep(0.02)`) // work inside the transaction
								return err
							})
							if err != nil {
								return // fenced out, or the test ended
							}
							written.Add(1)
						}
					})
				}
				defer func() { close(stop); wg.Wait() }()
				testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "writers running", func() bool { return written.Load() >= 12 })
				done := make(chan error, 1)
				go func() { done <- took() }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("still waiting after 10 s behind writers that keep sharing the partition")
				}
			}
			under(t1, 6, func() error { _, err := f.Fence(ctx, t2); return err })
			var t2c ownership.Token
			under(t2, 6, func() error {
				var err error
				t2c, err = f.Authority().Claim(ctx, 4, ownership.Node{Name: "c", Incarnation: 3}, t2)
				return err
			})
			under(t2c, 16, func() error { _, err := qualified.Fence(ctx, t3); return err })
		})
	}
}

// TestGateIsTheTablesWhateverNamesIt: the partition's gate is the
// table's, not its name's. A fence made with the schema-qualified name
// queues at the same advisory lock as writers through the plain name: it
// waits for the gate, not only for the row, and a writer that comes after
// it waits behind it and is then refused. Keyed on the name, the fence
// would wait for the row alone, and writers sharing the row could go on
// passing it (the starvation TestFenceNotStarvedByConcurrentWriters
// shows, which only some runs catch).
func TestGateIsTheTablesWhateverNamesIt(t *testing.T) {
	b := backends()[1]
	for _, via := range paths() {
		t.Run(via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: true})
			qualified, err := sqlfence.New(db, b.dialect, sqlfence.Config{Table: "public." + table})
			if err != nil {
				t.Fatal(err)
			}
			defer qualified.Close()
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1, t2 := fencetest.Tok(5, 1, "a", 1), fencetest.Tok(5, 2, "b", 2)
			mustFence(t, f, t1)

			// A writer under t1 holds the gate (shared) and the row.
			var holder int
			holding, release := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				first <- via.do(f, ctx, t1, ownership.Exact, func(tx sqlfence.Tx) error {
					if _, err := tx.ExecContext(ctx, kv.upsert, "k1", "v"); err != nil {
						return err
					}
					if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
						return err
					}
					close(holding)
					<-release
					return nil
				})
			}()
			select {
			case <-holding:
			case err := <-first:
				t.Fatalf("the first writer: %v", err)
			}
			defer func() {
				select {
				case <-release:
				default:
					close(release)
				}
			}()

			fenced := make(chan error, 1)
			go func() { _, err := qualified.Fence(ctx, t2); fenced <- err }()
			fence := gateWaiter(t, db, "the fence by the qualified name waiting for the gate the writer holds", holder)

			second := make(chan error, 1)
			go func() { second <- kv.put(ctx, f, t1, ownership.Exact, "k2", "v") }()
			gateWaiter(t, db, "the second writer waiting for the gate behind the fence", fence)
			select {
			case err := <-second:
				t.Fatalf("a writer passed a fence waiting for the gate: %v", err)
			case err := <-fenced:
				t.Fatalf("the fence passed a writer holding the gate: %v", err)
			default:
			}

			close(release)
			if err := <-first; err != nil {
				t.Fatalf("the first writer: %v", err)
			}
			if err := <-fenced; err != nil {
				t.Fatalf("Fence(%v): %v", t2, err)
			}
			if err := <-second; !errors.Is(err, ownership.ErrStaleToken) {
				t.Fatalf("the writer queued behind the fence = %v, want it refused as stale", err)
			}
		})
	}
}

// TestMonotonicTakesTheGateFirst: a Monotonic transaction takes the
// partition's advisory lock before its row, as fences do. While the
// advisory lock is held elsewhere, the Monotonic write waits without
// holding the row. It used to lock the row first and ask for the advisory
// lock in its raise: with a fence holding the advisory lock and waiting
// for the row, the two deadlocked.
func TestMonotonicTakesTheGateFirst(t *testing.T) {
	b := backends()[1]
	for _, via := range paths() {
		t.Run(via.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			f, table := newFenceTable(t, db, b.dialect, sqlfence.Config{})
			kv := newKV(t, db, via)
			ctx := testkit.Ctx(t, 60*time.Second)
			t1, t2 := fencetest.Tok(6, 1, "a", 1), fencetest.Tok(6, 2, "b", 2)
			mustFence(t, f, t1)
			key := `('"` + table + `"'::regclass::oid::bigint << 32 | 6)`

			gate, err := db.BeginTx(ctx, nil) // holds the partition's advisory lock
			if err != nil {
				t.Fatal(err)
			}
			defer gate.Rollback()
			if _, err := gate.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+key+`)`); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- kv.put(ctx, f, t2, ownership.Monotonic, "k", "v") }()
			testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the Monotonic write waiting for the advisory lock", func() bool {
				return lockWaiters(t, db, table, "advisory", "raise") > 0
			})

			probe, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer probe.Rollback()
			var n int
			if err := probe.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT 1 FROM "`+table+`" WHERE partition_id = 6 FOR NO KEY UPDATE NOWAIT) AS r`).Scan(&n); err != nil {
				t.Fatalf("the waiting Monotonic write holds the partition's row: %v", err)
			}
			probe.Rollback()
			gate.Rollback()
			if err := <-done; err != nil {
				t.Fatalf("the Monotonic write after the gate opened: %v", err)
			}
		})
	}
}
