package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// DefaultRequestsTable is the request table's name when
// RequestsConfig.Table is empty.
const DefaultRequestsTable = "tenure_requests"

// RequestsConfig configures Requests. The zero RequestsConfig is valid.
type RequestsConfig struct {
	// Table is the request table, named as Config.Table is. Default
	// DefaultRequestsTable.
	Table string
	// Now stamps each record, for Forget. Default time.Now.
	Now func() time.Time
}

// Requests makes writes exactly-once by request id: inside a fenced
// transaction (Fence.Do), Once runs a write only if its (partition, request
// id) has no record yet, records it with the write's result, and answers a
// duplicate with the first result instead of applying it again. A client
// (or a router) may then retry a write whose outcome was unknown as often
// as it likes.
//
// Why it holds: Once claims the id before it runs the write, by inserting
// its record; a duplicate's claim waits on the record's key until the
// first transaction ends, then finds the record (committed) or makes its
// own (rolled back). So duplicates apply once whether or not the fence
// serializes the partition's transactions (Config.Concurrent shares the
// partition's row). And a record commits with its write or not at all, so
// a duplicate finds it exactly when the first write committed, on this
// owner or a former one (whose commit, if it is accepted, precedes the new
// owner's fence). The record is per partition: route every retry by the
// same key. On PostgreSQL the duplicate's wait-then-read needs READ
// COMMITTED (its default): in a transaction at REPEATABLE READ or
// SERIALIZABLE a duplicate that waited gets a serialization failure
// instead of the first outcome (retry it). On MySQL the tests cover
// duplicates one after another, not racing ones. The claim comes after the fence's check, so a transaction
// waiting for a request id holds only locks its holder holds too (the
// partition's, shared): it adds no lock order, and a fence waits for both.
//
// The table (created by CreateSchema):
//
//	partition_id  BIGINT  the write's partition
//	request_id    TEXT    the id, as the client sent it (VARBINARY(255) on MySQL)
//	result        BLOB    what Once's fn returned (BYTEA on PostgreSQL)
//	created_ms    BIGINT  when it was recorded, Unix milliseconds
//
// Records are kept until Forget deletes them: keep them longer than any
// client may retry a write.
//
// Requests is safe for concurrent use.
type Requests struct {
	now                           func() time.Time
	maxID                         int // the longest id in bytes, 0 for no limit
	schema, claim, lookup, record string
	withdraw, forget              string
}

// NewRequests returns the request table of dialect d for cfg. It does not
// touch the database: call CreateSchema.
func NewRequests(d Dialect, cfg RequestsConfig) (*Requests, error) {
	if d.name == "" {
		return nil, errors.New("sqlfence: zero Dialect; use SQLite() or Postgres()")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultRequestsTable
	}
	t, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	blob := "BLOB"
	if d.name == Postgres().name {
		blob = "BYTEA"
	}
	if d.name == MySQL().name {
		return mysqlRequests(t, cfg.Now), nil
	}
	return &Requests{
		now: cfg.Now,
		schema: `CREATE TABLE IF NOT EXISTS ` + t + ` (
	partition_id BIGINT NOT NULL,
	request_id ` + d.textType + ` NOT NULL,
	result ` + blob + ` NOT NULL,
	created_ms BIGINT NOT NULL,
	PRIMARY KEY (partition_id, request_id))`,
		// The claim waits for a transaction that inserted the same key
		// and has not ended, and inserts nothing if the key is there.
		claim:    `INSERT INTO ` + t + ` (partition_id, request_id, result, created_ms) VALUES ($1, $2, $3, $4) ON CONFLICT (partition_id, request_id) DO NOTHING`,
		lookup:   `SELECT result FROM ` + t + ` WHERE partition_id = $1 AND request_id = $2`,
		record:   `UPDATE ` + t + ` SET result = $1 WHERE partition_id = $2 AND request_id = $3`,
		withdraw: `DELETE FROM ` + t + ` WHERE partition_id = $1 AND request_id = $2`,
		forget:   `DELETE FROM ` + t + ` WHERE created_ms < $1`,
	}, nil
}

// CreateSchema creates the request table if it does not exist.
func (r *Requests) CreateSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, r.schema); err != nil {
		return fmt.Errorf("sqlfence: create request table: %w", err)
	}
	return nil
}

// Once runs fn in tx, the transaction of a Fence.Do or DoConn (or a
// Batcher's batch) for partition p, unless
// p has a record of request id, and records fn's result under id. It
// returns fn's result and dup false, or, for a duplicate, the result
// recorded by the first write and dup true (fn does not run). A duplicate
// of a write whose transaction is still open waits for it to end. An error
// from fn is returned as it is and records nothing: the retry runs fn
// again. An empty id runs fn and records nothing. Ids are compared as
// bytes; on MySQL an id longer than 255 bytes is refused.
func (r *Requests) Once(ctx context.Context, tx Tx, p uint32, id string, fn func() ([]byte, error)) (result []byte, dup bool, err error) {
	if id == "" {
		result, err = fn()
		return result, false, err
	}
	if r.maxID > 0 && len(id) > r.maxID {
		return nil, false, fmt.Errorf("sqlfence: request id of %d bytes; at most %d", len(id), r.maxID)
	}
	// Claim the id first, with an empty result: a duplicate in another
	// transaction waits here until this one ends.
	res, err := tx.ExecContext(ctx, r.claim, int64(p), id, []byte{}, r.now().UnixMilli())
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return nil, false, fmt.Errorf("sqlfence: claim request %q of p%d: %w", id, p, err)
	}
	if n == 0 {
		if err := tx.QueryRowContext(ctx, r.lookup, int64(p), id).Scan(&result); err != nil {
			return nil, false, fmt.Errorf("sqlfence: look up request %q of p%d: %w", id, p, err)
		}
		return result, true, nil
	}
	if result, err = fn(); err != nil {
		// Withdraw the claim, in case the caller commits anyway.
		if _, werr := tx.ExecContext(ctx, r.withdraw, int64(p), id); werr != nil {
			return nil, false, fmt.Errorf("%w (and withdrawing request %q of p%d: %v)", err, id, p, werr)
		}
		return nil, false, err
	}
	if len(result) == 0 {
		return result, false, nil // the claim recorded it
	}
	if res, err = tx.ExecContext(ctx, r.record, result, int64(p), id); err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n != 1 {
		err = fmt.Errorf("%d records updated, want 1", n)
	}
	if err != nil {
		return nil, false, fmt.Errorf("sqlfence: record request %q of p%d: %w", id, p, err)
	}
	return result, false, nil
}

// Forget deletes the records made before before and returns how many.
func (r *Requests) Forget(ctx context.Context, db *sql.DB, before time.Time) (int64, error) {
	res, err := db.ExecContext(ctx, r.forget, before.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("sqlfence: forget requests: %w", err)
	}
	return res.RowsAffected()
}
