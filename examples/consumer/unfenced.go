package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/tenure-go/tenure/examples/consumer/consumer"
)

// unfencedCommit is consumer.Store.Commit without the fence: the same
// writes (the batch's effect, its applications and the partition's new
// offset) in a plain transaction, which nothing stops a stale owner from
// committing. Only the negative control (Scenario.Unfenced) uses it; the
// tables are those of consumer.Store with the given prefix.
func unfencedCommit(ctx context.Context, db *sql.DB, prefix string, b consumer.Batch) error {
	table := func(name string) string { return `"` + prefix + name + `"` }
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	for _, e := range b.Events {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table("balances")+` AS b (key, total) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET total = b.total + excluded.total`, e.Key, e.Amount); err != nil {
			return fmt.Errorf("unfenced apply p%d@%d: %w", e.Partition, e.Offset, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table("applied")+` (partition_id, event_offset, epoch, owner) VALUES ($1, $2, $3, $4)`,
			int64(e.Partition), e.Offset, int64(b.Token.Epoch), b.Token.Owner); err != nil {
			return fmt.Errorf("unfenced apply p%d@%d: %w", e.Partition, e.Offset, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+table("offsets")+` (partition_id, next_offset) VALUES ($1, $2)
ON CONFLICT (partition_id) DO UPDATE SET next_offset = excluded.next_offset`, int64(b.Token.Partition), b.Next()); err != nil {
		return fmt.Errorf("unfenced commit offset of p%d: %w", b.Token.Partition, err)
	}
	return tx.Commit()
}
