package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// batchCheckFigures weighs, on PostgreSQL, what DoConn's check costs a
// batch, beside the checks that might cost less: 16 flushers, one per
// partition as a Batcher's, each commit batches of two writes (a read
// and an update of a row, as lockrace's), all with the same round trips
// (BEGIN and the check in one message, the writes, "SELECT 1; COMMIT"):
//
//   - select1: "SELECT 1" in the check's place, the least any check costs;
//   - exact: DoConn's check, which locks the partition's row (FOR NO KEY
//     UPDATE: an xmax written to the row, a WAL record per batch);
//   - plain: the same check as a plain read of the row, without the lock
//     (not a fence: a fence landing meanwhile would not wait for it);
//   - advisory: the plain read under the partition's advisory lock taken
//     shared, as a lock-free check could keep the fence's guarantee.
//
// Figures sqlfence.postgres.batch_check.<kind>_over_select1: the median,
// over 8 rounds that alternate the kinds, of the kind's batches per
// second over select1's in the same round. Read them from a run without
// the race detector, which makes the client's work dominate.
func batchCheckFigures(t *testing.T) {
	const (
		flushers = 16
		batches  = 30 // per flusher and round
		rounds   = 8
		writes   = 2
	)
	db := testdb.Postgres(t)
	db.SetMaxOpenConns(2 * flushers) // the flushers' own, and DoConn's
	db.SetMaxIdleConns(2 * flushers)
	f, table := newFenceTable(t, db, sqlfence.Postgres(), sqlfence.Config{})
	ctx, cancel := testContext(t)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE batch_check_kv (k TEXT PRIMARY KEY, v BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO batch_check_kv SELECT 'p' || p || '-' || i, 0 FROM generate_series(0, $1) p, generate_series(0, 15) i`, flushers-1); err != nil {
		t.Fatal(err)
	}
	toks := make([]ownership.Token, flushers)
	conns := make([]*sql.Conn, flushers)
	for p := range flushers {
		toks[p] = tok(uint32(p), 1, "bench", 1)
		if _, err := f.Fence(ctx, toks[p]); err != nil {
			t.Fatal(err)
		}
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, `PREPARE batch_check_plain (BIGINT, BIGINT, TEXT, TEXT) AS SELECT 1 FROM `+table+
			` WHERE partition_id = $1 AND epoch = $2 AND owner = $3 AND incarnation = $4`); err != nil {
			t.Fatal(err)
		}
		conns[p] = c
	}
	write := func(ctx context.Context, tx sqlfence.Tx, p, i int) error {
		for w := range writes {
			k := fmt.Sprintf("p%d-%d", p, (i*writes+w)%16)
			var v int64
			if err := tx.QueryRowContext(ctx, `SELECT v FROM batch_check_kv WHERE k = $1`, k).Scan(&v); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE batch_check_kv SET v = $2 WHERE k = $1`, k, v+1); err != nil {
				return err
			}
		}
		return nil
	}
	// onConn runs a batch on p's connection after begin.
	onConn := func(begin func(p int) string) func(ctx context.Context, p, i int) error {
		return func(ctx context.Context, p, i int) error {
			c := conns[p]
			if _, err := c.ExecContext(ctx, begin(p)); err != nil {
				return err
			}
			if err := write(ctx, c, p, i); err != nil {
				_, _ = c.ExecContext(ctx, "ROLLBACK")
				return err
			}
			_, err := c.ExecContext(ctx, "SELECT 1; COMMIT")
			return err
		}
	}
	plain := func(p int) string {
		return fmt.Sprintf("EXECUTE batch_check_plain(%d, 1, 'bench', '%016x')", p, toks[p].Incarnation)
	}
	kinds := []struct {
		name string
		run  func(ctx context.Context, p, i int) error
	}{
		{"select1", onConn(func(int) string { return "BEGIN; SELECT 1" })},
		{"exact", func(ctx context.Context, p, i int) error {
			return f.DoConn(ctx, toks[p], ownership.Exact, func(tx sqlfence.Tx) error { return write(ctx, tx, p, i) })
		}},
		{"plain", onConn(func(p int) string { return "BEGIN; " + plain(p) })},
		{"advisory", onConn(func(p int) string {
			return fmt.Sprintf("BEGIN; SELECT pg_advisory_xact_lock_shared('%s'::regclass::oid::bigint << 32 | %d); %s", table, p, plain(p))
		})},
	}
	ratios := make([][]float64, len(kinds))
	for r := range rounds {
		took := make([]time.Duration, len(kinds))
		for j := range kinds {
			k := (r + j) % len(kinds)
			start := time.Now()
			var wg sync.WaitGroup
			for p := range flushers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range batches {
						if err := kinds[k].run(ctx, p, i); err != nil {
							t.Errorf("%s: %v", kinds[k].name, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			took[k] = time.Since(start)
		}
		for k := range kinds {
			ratios[k] = append(ratios[k], float64(took[0])/float64(took[k]))
		}
	}
	for k, kind := range kinds[1:] {
		x := ratios[k+1]
		slices.Sort(x)
		fmt.Printf("figure: sqlfence.postgres.batch_check.%s_over_select1 %.3f\n", kind.name, x[len(x)/2])
		t.Logf("%s over select1: %.3f-%.3f in %d rounds", kind.name, x[0], x[len(x)-1], rounds)
	}
}
