package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// DefaultOffsetsTable is the offset table's name when OffsetsConfig.Table
// is empty.
const DefaultOffsetsTable = "tenure_offsets"

// ErrOffsetMoved is returned (wrapped in an *OffsetMovedError) by
// Offsets.Advance and Offsets.Commit for a batch read from an offset that
// is no longer the partition's committed one: an earlier commit of the
// same events landed (one whose answer was lost), or another writer moved
// the offset. Nothing was applied; read the next batch from the committed
// offset.
var ErrOffsetMoved = errors.New("sqlfence: the committed offset moved since the batch was read")

// OffsetMovedError is the error of a compare-and-set on an offset that
// failed: it carries the offset the batch was read from and the committed
// one. It wraps ErrOffsetMoved.
type OffsetMovedError struct {
	Partition uint32
	From      int64 // the offset the batch was read from
	Current   int64 // the partition's committed offset
}

func (e *OffsetMovedError) Error() string {
	return fmt.Sprintf("%v: p%d batch read from %d, committed offset %d", ErrOffsetMoved, e.Partition, e.From, e.Current)
}

func (e *OffsetMovedError) Unwrap() error { return ErrOffsetMoved }

// OffsetsConfig configures Offsets. The zero OffsetsConfig is valid.
type OffsetsConfig struct {
	// Table is the offset table, named as Config.Table is. Default
	// DefaultOffsetsTable.
	Table string
}

// Offsets keeps each partition's committed offset (the first event not
// yet consumed) in a table beside the fence, so that a consumer commits a
// batch's effects and its new offset in one fenced transaction, or
// neither. The commit is a compare-and-set: it applies only if the
// committed offset is still the one the batch was read from, so a commit
// whose answer was lost (ownership.ErrOutcomeUnknown) and is then retried,
// or whose events are read again and committed, is applied once: the
// second attempt fails with ErrOffsetMoved and writes nothing.
//
// Why it holds: the compare-and-set is one conditional UPDATE (or, for a
// partition's first commit, one INSERT that does nothing on a conflict)
// inside the fenced transaction: two transactions that read the same
// offset can't both move it, whatever the fence's mode, and the
// transaction commits only under the lease's token, so a former owner
// can't move it either.
//
// The table (created by CreateSchema):
//
//	partition_id  BIGINT PRIMARY KEY
//	next_offset   BIGINT  the first event not yet consumed
//
// A partition without a row is at offset 0. Offsets is safe for
// concurrent use.
type Offsets struct {
	schema, read, move, first string
	// mysql: move's parameters are (next, p, from), and an UPDATE that
	// changes nothing counts 0 rows (from == next).
	mysql bool
}

// NewOffsets returns the offset table of dialect d for cfg. It does not
// touch the database: call CreateSchema.
func NewOffsets(d Dialect, cfg OffsetsConfig) (*Offsets, error) {
	if d.name == "" {
		return nil, errors.New("sqlfence: zero Dialect; use SQLite(), Postgres() or MySQL()")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultOffsetsTable
	}
	t, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	if d.name == MySQL().name {
		return mysqlOffsets(t), nil
	}
	return &Offsets{
		schema: `CREATE TABLE IF NOT EXISTS ` + t + ` (
	partition_id BIGINT NOT NULL PRIMARY KEY,
	next_offset BIGINT NOT NULL)`,
		read:  `SELECT next_offset FROM ` + t + ` WHERE partition_id = $1`,
		move:  `UPDATE ` + t + ` SET next_offset = $3 WHERE partition_id = $1 AND next_offset = $2`,
		first: `INSERT INTO ` + t + ` (partition_id, next_offset) VALUES ($1, $2) ON CONFLICT (partition_id) DO NOTHING`,
	}, nil
}

// CreateSchema creates the offset table if it does not exist.
func (o *Offsets) CreateSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, o.schema); err != nil {
		return fmt.Errorf("sqlfence: create offset table: %w", err)
	}
	return nil
}

// Querier runs a query: a *sql.DB, a *sql.Tx, a *sql.Conn, or the Tx of
// DoConn.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Get returns partition p's committed offset (0 if it has none), read
// through q. Read it through the database before reading a batch: the
// commit checks it again.
func (o *Offsets) Get(ctx context.Context, q Querier, p uint32) (int64, error) {
	var next int64
	err := q.QueryRowContext(ctx, o.read, int64(p)).Scan(&next)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("sqlfence: offset of p%d: %w", p, err)
	}
	return next, nil
}

// Advance moves partition p's committed offset from from to next in tx,
// the transaction of a Fence.Do or DoConn for p, if it is still from. If
// it is not, it returns an *OffsetMovedError and writes nothing; return
// the error from fn, so that the transaction rolls back. next must not be
// below from.
func (o *Offsets) Advance(ctx context.Context, tx Tx, p uint32, from, next int64) error {
	if next < from || from < 0 {
		return fmt.Errorf("sqlfence: advance p%d from %d to %d: offsets only move forward", p, from, next)
	}
	args := []any{int64(p), from, next}
	if o.mysql {
		args = []any{next, int64(p), from}
	}
	res, err := tx.ExecContext(ctx, o.move, args...)
	if err != nil {
		return fmt.Errorf("sqlfence: advance the offset of p%d: %w", p, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("sqlfence: advance the offset of p%d: %w", p, err)
	}
	if n == 1 {
		return nil
	}
	if from == 0 {
		// No row moved: either the partition has none yet (its first
		// commit) or its offset is not 0.
		res, err := tx.ExecContext(ctx, o.first, int64(p), next)
		if err != nil {
			return fmt.Errorf("sqlfence: advance the offset of p%d: %w", p, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return fmt.Errorf("sqlfence: advance the offset of p%d: %w", p, err)
		}
		if n == 1 {
			return nil
		}
	}
	cur, err := o.Get(ctx, tx, p)
	if err != nil {
		return err
	}
	if o.mysql && from == next && cur == from {
		return nil // MySQL counts a row the UPDATE matched but left as it was as 0
	}
	return &OffsetMovedError{Partition: p, From: from, Current: cur}
}

// Commit runs fn and moves t's partition's committed offset from from to
// next, in one transaction of f.DoConn in Exact mode that commits only if
// t is the partition's fencing token and the offset is still from. The
// offset is checked before fn runs, so fn's work is not wasted on a batch
// already committed. Its errors are DoConn's (an error wrapping
// ownership.ErrStaleToken: a newer owner exists; one wrapping
// ownership.ErrOutcomeUnknown: perhaps committed, read the offset again),
// fn's, unchanged, and an *OffsetMovedError: the batch was committed
// before (or by another), nothing was applied.
//
// Exact, not Monotonic: the coordinator fences every new token before the
// owner reads, so the owner always writes under the mark; Monotonic would
// let an owner that read the offset without fencing advance the mark after
// a former owner moved the offset under it.
func (o *Offsets) Commit(ctx context.Context, f *Fence, t ownership.Token, from, next int64, fn func(tx Tx) error) error {
	return f.DoConn(ctx, t, ownership.Exact, func(tx Tx) error {
		if err := o.Advance(ctx, tx, t.Partition, from, next); err != nil {
			return err
		}
		if fn == nil {
			return nil
		}
		return fn(tx)
	})
}
