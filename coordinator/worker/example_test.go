package worker_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A consumer of an event table: each batch is read from the partition's
// committed offset and committed with its effects under the fence.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:consumer.db?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8) // the workers' MaxConcurrent
	db.SetMaxIdleConns(8)
	fence, _ := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	offsets, _ := sqlfence.NewOffsets(sqlfence.SQLite(), sqlfence.OffsetsConfig{})
	_ = fence.CreateSchema(ctx)
	_ = offsets.CreateSchema(ctx, db)

	rt, err := worker.New(worker.Config{
		MaxConcurrent: 8,
		Process: func(ctx context.Context, lease *ownership.Lease) (int, error) {
			p := lease.Partition()
			from, err := offsets.Get(ctx, db, p)
			if err != nil {
				return 0, err
			}
			var n int64
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM events
WHERE partition_id = $1 AND event_offset >= $2 LIMIT 32)`, p, from).Scan(&n); err != nil || n == 0 {
				return 0, err
			}
			err = offsets.Commit(ctx, fence, lease.Token(), from, from+n, func(tx sqlfence.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO totals (key, total)
SELECT key, SUM(amount) FROM events WHERE partition_id = $1 AND event_offset >= $2 AND event_offset < $3 GROUP BY key
ON CONFLICT (key) DO UPDATE SET total = totals.total + excluded.total`, p, from, from+n)
				return err
			})
			return int(n), err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close() // after the coordinator's Close or Leave

	cfg := coordinator.LANConfig()
	cfg.Name = "node-1"
	cfg.Handler = rt
	cfg.Fence = fence
	c, err := coordinator.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	rt.Bind(c)
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Leave(ctx) // each worker commits the batch in hand first
}
