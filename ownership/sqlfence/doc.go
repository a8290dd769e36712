// Package sqlfence fences a SQL database: it keeps each partition's
// high-water mark (the highest fencing token fenced) in a table, and runs
// an owner's writes in a transaction that commits only while the owner's
// token is the mark, so that a paused or partitioned former owner can't
// overwrite what the new owner wrote or read.
//
// It works over database/sql and imports no driver: the program imports
// one and passes a *sql.DB with the matching Dialect, SQLite (for example
// modernc.org/sqlite, driver "sqlite"), Postgres (for example
// github.com/jackc/pgx/v5/stdlib, driver "pgx") or MySQL, for MySQL and
// MariaDB (for example github.com/go-sql-driver/mysql, driver "mysql").
//
// # Schema
//
// One table, by default tenure_partitions, with one row per partition that
// has ever been fenced:
//
//	partition_id  BIGINT PRIMARY KEY
//	epoch         BIGINT    the mark's epoch (>= 1)
//	owner         TEXT      the mark's owner node, compared bytewise
//	incarnation   TEXT      the owner's incarnation, 16 lowercase hex digits
//
// Fence.CreateSchema creates it. The application's own tables live beside
// it, in the same database, so that a fenced transaction covers both.
//
// # Modes
//
// Do checks the token in one of two modes (see ownership.Mode). Exact, the
// default to reach for, accepts only the token fenced last: an owner that
// fences on acquire always writes under the mark, and anything else is a
// former owner (ownership.ErrStaleToken) or an owner that skipped the fence
// (ownership.ErrNotFenced). Monotonic accepts any token not below the mark
// and lets a higher one advance it; use it when writers may reach the
// database without fencing first.
//
// # Do and DoConn
//
// Do hands fn a *sql.Tx. On PostgreSQL that costs a round trip more than
// the same transaction unfenced: database/sql sends BEGIN, then the check,
// then fn's statements, then COMMIT. DoConn sends BEGIN and the check in
// one message and hands fn a Tx (the statement methods of *sql.Tx) on a
// connection of its own, so the check costs no round trip, only the
// server's work on one more statement. Both promise the same; the token
// DoConn puts in its message is written as literals (numbers, hex, and the
// owner name quoted only if it is letters, digits and "-_.:/@", else hex
// decoded by the server), never as SQL text from the caller. On SQLite,
// which has no round trips, DoConn is Do.
//
// # The caller's duties, in order
//
//  1. Open the database. For SQLite use WAL mode and a busy timeout, e.g.
//     "file:PATH?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)":
//     without the timeout concurrent writers fail with SQLITE_BUSY.
//     Size the pool for the partitions a node may write at once (a worker
//     per partition: coordinator/worker's MaxConcurrent): set
//     sql.DB.SetMaxOpenConns and SetMaxIdleConns to it. database/sql
//     keeps only 2 idle connections by default; a consumer with a
//     goroutine per partition on that default opened 15-21 new PostgreSQL
//     connections a second, each a new backend process, and its tests ran
//     over 5.5 minutes instead of 27 s.
//  2. New, then CreateSchema once before the first fence.
//  3. On acquiring a partition, Fence the lease's token before reading the
//     partition's state or serving it. After Fence returns, no write under
//     an older token can commit. A stale-token error means a newer owner
//     exists: give the lease up.
//  4. Make every write to the partition's state through Do or DoConn with
//     the lease's token, and through the transaction it hands to fn only.
//     Writes made outside them are not fenced.
//  5. On ownership.ErrStaleToken, end the lease: the partition has a newer
//     owner. An error from the commit itself wraps
//     ownership.ErrOutcomeUnknown: the write may have committed. Fence
//     again and re-read before relying on it; retry it only if the
//     database deduplicates it (Requests, or Offsets for a consumer's
//     batches). A session the server ended before the commit
//     (idle_in_transaction_session_timeout, pg_terminate_backend, a
//     restart) fails fn's next statement with the driver's error (pgx:
//     "FATAL: terminating connection due to idle-in-transaction timeout
//     (SQLSTATE 25P03)"); Do and DoConn return it wrapped in a
//     *SessionEndedError (errors.Is ErrSessionEnded): nothing committed,
//     the server rolled the transaction back and released its locks. If
//     the partition's mark had moved past the token by then, the error
//     wraps ownership.ErrStaleToken too: end the lease. Otherwise the
//     lease may still be live; read the state again and retry. If the
//     session ends during the COMMIT, the error wraps ErrOutcomeUnknown.
//  6. Close the Fence when done (it holds prepared statements), then the
//     database.
//
// Do transactions on one partition run one at a time: the check locks the
// partition's row until the transaction ends, and a Fence waits for them.
// Different partitions proceed in parallel on PostgreSQL; SQLite has one
// writer for the whole database. With Config.Concurrent, the Exact
// transactions of a partition on PostgreSQL share the row's lock and run
// side by side (a Fence still waits for every one): for an owner that
// orders its own writes per key, whose partition's transactions would
// otherwise wait for each other's round trips.
//
// So a holder paused (SIGSTOP, a long GC, a frozen VM) or cut off from the
// database inside Do keeps its lock: the partition's row on PostgreSQL,
// the whole database's write lock on SQLite. The new owner's Fence or
// claim waits for it, and safety holds (the paused transaction fails its
// check or is rolled back), but failover waits too. On PostgreSQL bound
// the wait with the session setting idle_in_transaction_session_timeout
// (examples/kvstore sets 2 s): the server ends a session left idle inside
// a transaction and releases its locks. With pgx, set it as a run-time
// parameter of the connection config before opening the pool:
//
//	cfg, _ := pgx.ParseConfig(dsn)
//	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "2s"
//	db := stdlib.OpenDB(*cfg)
//
// (or "?options=-c%20idle_in_transaction_session_timeout%3D2s" in the
// DSN); TestKilledSessionRollsBack and TestTerminatedSessionClassified
// hold what such a killed session looks like to the caller. SQLite has no such bound: a
// process stopped inside a write transaction stalls every writer of the
// file until it runs again or dies.
//
// # Cost
//
// The check is one statement more in the transaction, not one round trip
// more: DoConn sends it with BEGIN. Its price is the server's work on it,
// an index lookup and a row lock. On loopback, where a round trip costs
// little more than that work, a fenced transaction of one upsert runs at
// about 0.8x the unfenced one; across a network (about 2 ms a round trip,
// through a delay proxy) at 0.98x. Do, which hands fn a *sql.Tx, sends the
// check in a round trip of its own: 0.75x there. The package's TestFigures
// prints these.
//
// # Offsets
//
// Offsets keeps a consumer's committed offset per partition in a table
// beside the fence: Offsets.Commit runs the batch's effects and moves the
// offset by compare-and-set in one fenced transaction, so a batch whose
// commit was in doubt, retried or read again, is applied once (the retry
// fails with ErrOffsetMoved), on SQLite, PostgreSQL and MySQL/MariaDB
// (TestMariaDBOffsets). coordinator/worker runs the consumers.
//
// # Batching
//
// The owner of a partition is its only writer, so it may commit many
// callers' writes to it in one fenced transaction, checking the token
// once: a Batcher queues the writes of each partition and commits them in
// batches (at most MaxWrites, after at most MaxWait, at once when the
// partition is idle), giving each caller its own outcome. A write's own
// error fails that write only; a stale token refuses the whole batch; a
// commit whose answer is lost leaves every write of the batch in doubt
// (ownership.ErrOutcomeUnknown). Request ids (Requests) keep it
// exactly-once, duplicates in one batch included.
//
// # Epochs
//
// Fence.Authority mints epochs with a conditional update of the same table
// (UPDATE ... SET epoch = epoch + 1 ... WHERE partition_id = $p AND epoch =
// $seen): per partition, epochs are dense, increase in real-time order, and
// each is held by one node. A claim is also a fence.
package sqlfence
