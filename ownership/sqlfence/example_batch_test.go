package sqlfence_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A Batcher commits the writes that callers make to a partition at the
// same time in one fenced transaction; each caller gets its own outcome.
// Here one write of four breaks a constraint: it fails alone.
func ExampleBatcher() {
	ctx := context.Background()
	db, done := exampleDB(ctx)
	defer done()
	lease := ownership.NewLease(ctx, ownership.Token{Partition: 3, Epoch: 1, Owner: "node-1", Incarnation: 1})

	f, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	check(err)
	defer f.Close()
	check(f.CreateSchema(ctx))
	_, err = f.Fence(ctx, lease.Token())
	check(err)
	b, err := sqlfence.NewBatcher(f, sqlfence.BatchConfig{})
	check(err)
	defer b.Close()

	ids := []string{"bob", "carol", "alice", "dave"} // alice exists: her INSERT fails
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			_, _, errs[i] = b.Do(ctx, lease.Token(), "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO accounts VALUES ($1, 0)`, id)
				return nil, err
			})
		})
	}
	wg.Wait()
	for i, id := range ids {
		fmt.Println(id, errs[i] == nil)
	}
	var n int
	check(db.QueryRowContext(ctx, `SELECT COUNT(*) FROM accounts`).Scan(&n))
	fmt.Println("accounts:", n)
	// Output:
	// bob true
	// carol true
	// alice false
	// dave true
	// accounts: 4
}
