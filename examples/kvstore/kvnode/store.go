package kvnode

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	// The two database drivers this program supports. tenure itself
	// imports none: the program chooses.
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// idleInTransaction is PostgreSQL's idle_in_transaction_session_timeout
// for the nodes' sessions, unless the DSN sets it. A node paused (or cut
// off from the database) inside a fenced transaction holds its partition's
// fence row locked; the new owner's claim waits on that lock until the
// server ends the idle session. The nodes' transactions never idle for
// more than milliseconds.
const idleInTransaction = 2 * time.Second

// sqliteBusyTimeout is how long a SQLite statement waits for another
// connection's (or process's) write lock before failing with SQLITE_BUSY.
const sqliteBusyTimeout = 10 * time.Second

// OpenDB opens the database every node shares: PostgreSQL through pgx when
// dsn is set, else the SQLite file at dataPath in WAL mode with a busy
// timeout, so several processes on one machine can use it at once, their
// writers taking turns in the order they came (a queue in the file
// dataPath+"-queue", on Linux). It creates nothing but that file; the
// caller closes the database.
func OpenDB(dataPath, dsn string) (*sql.DB, error) {
	db, _, err := openDB(dataPath, dsn)
	return db, err
}

func openDB(dataPath, dsn string) (*sql.DB, sqlfence.Dialect, error) {
	if dsn != "" {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, sqlfence.Dialect{}, fmt.Errorf("kvnode: PostgreSQL DSN: %w", err)
		}
		if _, ok := cfg.RuntimeParams["idle_in_transaction_session_timeout"]; !ok &&
			!strings.Contains(cfg.RuntimeParams["options"], "idle_in_transaction_session_timeout") {
			cfg.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(idleInTransaction.Milliseconds(), 10)
		}
		return stdlib.OpenDB(*cfg), sqlfence.Postgres(), nil
	}
	if dataPath == "" || strings.ContainsAny(dataPath, "?#") {
		return nil, sqlfence.Dialect{}, fmt.Errorf("kvnode: SQLite path %q: want a file name without '?' or '#'", dataPath)
	}
	// WAL lets readers run beside the one writer; the busy timeout makes a
	// writer wait for the lock instead of failing; the write queue makes
	// the writers of all the processes sharing the file wait in turn
	// (writeQueue).
	q, err := newWriteQueue(dataPath)
	if err != nil {
		return nil, sqlfence.Dialect{}, err
	}
	db := sql.OpenDB(&queuedConnector{
		drv: &sqlite.Driver{},
		dsn: fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)", dataPath, sqliteBusyTimeout.Milliseconds()),
		q:   q,
	})
	return db, sqlfence.SQLite(), nil
}

// The application's tables. kv holds the current value of each key and the
// token it was written under; kv_log records every write applied, in
// commit order per partition, so VerifyLog can check the history.
func schema(d sqlfence.Dialect) []string {
	blob, id := "BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT"
	if d.String() == sqlfence.Postgres().String() {
		blob, id = "BYTEA", "BIGSERIAL PRIMARY KEY"
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS kv (
	key TEXT NOT NULL PRIMARY KEY,
	value ` + blob + ` NOT NULL,
	partition BIGINT NOT NULL,
	epoch BIGINT NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS kv_log (
	id ` + id + `,
	partition BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	owner TEXT NOT NULL,
	incarnation TEXT NOT NULL,
	key TEXT NOT NULL,
	value ` + blob + ` NOT NULL,
	mark_epoch BIGINT,
	mark_owner TEXT,
	mark_incarnation TEXT,
	request_id TEXT
)`,
	}
}

// createSchema creates the fence table and the application's tables. Nodes
// starting together may race to create them on PostgreSQL, where one of
// two concurrent CREATE TABLE IF NOT EXISTS can fail: it tries a few times.
func createSchema(ctx context.Context, db *sql.DB, d sqlfence.Dialect, f *sqlfence.Fence, reqs *sqlfence.Requests) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			case <-ctx.Done():
				return fmt.Errorf("kvnode: create schema: %w (last error: %v)", ctx.Err(), err)
			}
		}
		if err = f.CreateSchema(ctx); err != nil {
			continue
		}
		if err = reqs.CreateSchema(ctx, db); err != nil {
			continue
		}
		for _, stmt := range schema(d) {
			if _, err = db.ExecContext(ctx, stmt); err != nil {
				break
			}
		}
		if err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kvnode: create schema: %w", err)
	}
	// CREATE TABLE IF NOT EXISTS leaves a kv_log from an older kvstore as it
	// was: say so now rather than fail every write.
	if _, err := db.ExecContext(ctx, `SELECT mark_epoch, mark_owner, mark_incarnation, request_id FROM kv_log WHERE 1 = 0`); err != nil {
		return fmt.Errorf("kvnode: table kv_log predates the mark and request id columns (drop kv and kv_log, or use a new database): %w", err)
	}
	return nil
}

const (
	upsertKV = `INSERT INTO kv (key, value, partition, epoch) VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, partition = excluded.partition, epoch = excluded.epoch`
	// The log record also keeps the partition's mark as this transaction
	// sees it, read from the fence table: the fence's own state, for
	// VerifyLog to check against the record's token.
	appendLog = `INSERT INTO kv_log (partition, epoch, owner, incarnation, key, value, request_id, mark_epoch, mark_owner, mark_incarnation)
VALUES ($1, $2, $3, $4, $5, $6, $7,
	(SELECT epoch FROM ` + sqlfence.DefaultTable + ` WHERE partition_id = $1),
	(SELECT owner FROM ` + sqlfence.DefaultTable + ` WHERE partition_id = $1),
	(SELECT incarnation FROM ` + sqlfence.DefaultTable + ` WHERE partition_id = $1))`
	selectKV = `SELECT value FROM kv WHERE key = $1`
)

// requestsTable records the request ids of the writes applied
// (sqlfence.Requests).
const requestsTable = "kv_requests"

// put writes key = value and its log record in tx, the fenced transaction
// of the lease whose token is t, for request id (may be empty).
func put(ctx context.Context, tx sqlfence.Tx, t ownership.Token, id, key string, value []byte) error {
	if value == nil {
		value = []byte{} // NOT NULL: an empty value is still a value
	}
	if _, err := tx.ExecContext(ctx, upsertKV, key, value, int64(t.Partition), int64(t.Epoch)); err != nil {
		return fmt.Errorf("kvnode: write %q: %w", key, err)
	}
	var reqID sql.NullString
	if id != "" {
		reqID = sql.NullString{String: id, Valid: true}
	}
	if _, err := tx.ExecContext(ctx, appendLog, int64(t.Partition), int64(t.Epoch), t.Owner,
		fmt.Sprintf("%016x", t.Incarnation), key, value, reqID); err != nil {
		return fmt.Errorf("kvnode: log write of %q: %w", key, err)
	}
	return nil
}

// VerifyLog checks the write log (table kv_log) of a kvstore database. A
// record is a violation if
//
//   - the partition's mark, read from the fence table in the write's own
//     transaction, is not the write's token: the write committed while the
//     database held another owner's token, so the fence let a stale (or
//     unfenced) write through, even if no newer write followed it; or
//   - its token is lower than one applied before it in the partition
//     (ownership.Token.Compare, epoch first), in commit order.
//
// So zero violations means no stale write was accepted (S1, S2). The mark
// check relies on the fence holding the partition's row locked from its
// check to the commit (as sqlfence does): a fence that checked without
// that lock could let a newer fence commit after the record was written.
//
// Only the records of keys that start with keyPrefix are read ("" for
// all): a run that shares the database with others checks its own.
//
// Commit order within a partition is id order: a write's fenced transaction
// locks its partition's fence row before it inserts its log record and
// holds the lock until it commits, so the writes of one partition take
// their ids one transaction at a time (with SQLite, one transaction at a
// time overall).
//
// rows is the number of log records read.
func VerifyLog(ctx context.Context, db *sql.DB, keyPrefix string) (rows, violations int, err error) {
	rs, err := db.QueryContext(ctx, `SELECT partition, epoch, owner, incarnation,
	COALESCE(mark_epoch, 0), COALESCE(mark_owner, ''), COALESCE(mark_incarnation, '')
FROM kv_log WHERE substr(key, 1, $1) = $2 ORDER BY partition, id`, len(keyPrefix), keyPrefix)
	if err != nil {
		return 0, 0, fmt.Errorf("kvnode: read kv_log: %w", err)
	}
	defer rs.Close()
	var last ownership.Token // the highest token applied so far in its partition
	for rs.Next() {
		rows++
		var p, epoch, markEpoch int64
		var owner, inc, markOwner, markInc string
		if err := rs.Scan(&p, &epoch, &owner, &inc, &markEpoch, &markOwner, &markInc); err != nil {
			return rows, violations, fmt.Errorf("kvnode: read kv_log: %w", err)
		}
		incarnation, err := strconv.ParseUint(inc, 16, 64)
		if err != nil || p < 0 || p > 1<<32-1 || epoch < 0 {
			return rows, violations, fmt.Errorf("kvnode: kv_log row %d: malformed token (p%d, epoch %d, incarnation %q)", rows, p, epoch, inc)
		}
		t := ownership.Token{Partition: uint32(p), Epoch: uint64(epoch), Owner: owner, Incarnation: incarnation}
		if epoch != markEpoch || owner != markOwner || inc != markInc ||
			rows > 1 && t.Partition == last.Partition && t.Less(last) {
			violations++
			continue
		}
		last = t
	}
	if err := rs.Err(); err != nil {
		return rows, violations, fmt.Errorf("kvnode: read kv_log: %w", err)
	}
	return rows, violations, nil
}

// getValue reads key's value; found is false when it was never written.
func getValue(ctx context.Context, db *sql.DB, key string) (value []byte, found bool, err error) {
	err = db.QueryRowContext(ctx, selectKV, key).Scan(&value)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("kvnode: read %q: %w", key, err)
	}
	return value, true, nil
}

// CountDuplicates counts the writes of a kvstore database's log (table
// kv_log) that were applied more than once: every record beyond the first
// of a request id, or, for writes without one, of a (key, value) pair
// (writers that never write a value twice to a key, as the demo's and the
// tests' do, see every repeat as a duplicate). Only the records of keys
// that start with keyPrefix are read. rows is the number read.
func CountDuplicates(ctx context.Context, db *sql.DB, keyPrefix string) (rows, duplicates int, err error) {
	rs, err := db.QueryContext(ctx, `SELECT key, value, COALESCE(request_id, '') FROM kv_log WHERE substr(key, 1, $1) = $2`, len(keyPrefix), keyPrefix)
	if err != nil {
		return 0, 0, fmt.Errorf("kvnode: read kv_log: %w", err)
	}
	defer rs.Close()
	ids, writes := map[string]bool{}, map[[2]string]bool{}
	for rs.Next() {
		rows++
		var key, id string
		var value []byte
		if err := rs.Scan(&key, &value, &id); err != nil {
			return rows, duplicates, fmt.Errorf("kvnode: read kv_log: %w", err)
		}
		seen := false
		if id != "" {
			seen, ids[id] = ids[id], true
		} else {
			w := [2]string{key, string(value)}
			seen, writes[w] = writes[w], true
		}
		if seen {
			duplicates++
		}
	}
	if err := rs.Err(); err != nil {
		return rows, duplicates, fmt.Errorf("kvnode: read kv_log: %w", err)
	}
	return rows, duplicates, nil
}
