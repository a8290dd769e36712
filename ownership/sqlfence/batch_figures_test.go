package sqlfence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// batchFigures prints, per backend, the throughput of a Batcher whose
// writes keep their errors their own by savepoints over the same Batcher
// re-running a batch without a failed write: 16 writers of one partition,
// one upsert per write, with no write failing and with one in 20 failing
// (a duplicate key). Rounds of the two alternate, so drift hits both.
func batchFigures(t *testing.T) {
	for _, be := range append(figureBackends(), mariadb) {
		db := be.open(t)
		f := newFence(t, db, be.dialect)
		table := uniqueName(t, db, "batchfig")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if _, err := db.ExecContext(ctx, `CREATE TABLE "`+table+`" (k BIGINT PRIMARY KEY, v BIGINT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		tk := fencetest.Tok(1, 1, "a", 1)
		if _, err := f.Fence(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO "`+table+`" (k, v) VALUES (-1, 0)`); err != nil {
			t.Fatal(err)
		}
		upsert := `INSERT INTO "` + table + `" (k, v) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET v = "` + table + `".v + 1`
		if be.name == "mariadb" {
			upsert = `INSERT INTO "` + table + `" (k, v) VALUES (?, 1) ON DUPLICATE KEY UPDATE v = v + 1`
		}
		for _, failEvery := range []int{0, 20} {
			took := map[bool]time.Duration{}
			sizes := map[bool]int{}
			for round := range 6 {
				sp := round%2 == 1
				var mu sync.Mutex
				batches := 0
				b, err := sqlfence.NewBatcher(f, sqlfence.BatchConfig{Savepoints: sp, Observe: func(sqlfence.BatchInfo) {
					mu.Lock()
					batches++
					mu.Unlock()
				}})
				if err != nil {
					t.Fatal(err)
				}
				const writers, each = 16, 40
				start := time.Now()
				var wg sync.WaitGroup
				for w := range writers {
					wg.Go(func() {
						for i := range each {
							n := w*each + i
							_, _, err := b.Do(ctx, tk, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
								if failEvery > 0 && n%failEvery == 0 {
									_, err := tx.ExecContext(ctx, `INSERT INTO "`+table+`" (k, v) VALUES (-1, 0)`)
									return nil, err
								}
								_, err := tx.ExecContext(ctx, upsert, n%256)
								return nil, err
							})
							if (err == nil) == (failEvery > 0 && n%failEvery == 0) || ownershipErr(err) {
								t.Errorf("write %d: %v", n, err)
							}
						}
					})
				}
				wg.Wait()
				if round >= 2 {
					took[sp] += time.Since(start)
					sizes[sp] += batches
				}
				b.Close()
			}
			name := fmt.Sprintf("batch.%s.fail%d", be.name, failEvery)
			const n = 2 * 16 * 40
			fmt.Printf("figure: %s.rerun_writes_per_second %.0f\n", name, n/took[false].Seconds())
			fmt.Printf("figure: %s.savepoints_writes_per_second %.0f\n", name, n/took[true].Seconds())
			fmt.Printf("figure: %s.savepoints_over_rerun %.2f\n", name, took[false].Seconds()/took[true].Seconds())
			fmt.Printf("figure: %s.size_mean %.1f\n", name, float64(2*n)/float64(sizes[false]+sizes[true]))
		}
		cancel()
	}
}

// ownershipErr reports an error that is the fence's, not the write's.
func ownershipErr(err error) bool {
	return err != nil && (isAny(err, ownership.ErrStaleToken, ownership.ErrOutcomeUnknown, ownership.ErrNotFenced))
}

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
