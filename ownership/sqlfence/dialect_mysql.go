package sqlfence

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// MySQL returns the dialect for MySQL 8 and MariaDB 10.3 or later (InnoDB
// tables), for example through github.com/go-sql-driver/mysql (driver
// name "mysql"). Its parameters are "?", so the SQL a program writes for
// its own tables differs from the other dialects'.
//
// The driver must report rows affected, not rows found (the default of
// go-sql-driver/mysql; don't set clientFoundRows): a fence or claim that
// changes nothing must say 0. Fenced transactions work at REPEATABLE READ
// (InnoDB's default) and READ COMMITTED: the check is a locking read
// (SELECT ... FOR UPDATE), which reads the latest mark, and holds the
// partition's row until the transaction ends.
//
// There are no shared checks (Config.Concurrent is ignored): MySQL's
// advisory locks (GET_LOCK) belong to the session, not the transaction,
// so they can't queue shared checks behind a waiting fence as
// PostgreSQL's do. DoConn is Do: sending BEGIN and the check in one
// message needs the driver's multiStatements, which also lets a
// statement's parameters run as SQL where they are interpolated, so the
// library does not ask for it.
func MySQL() Dialect {
	return Dialect{
		name: "mysql",
		// Owners are bytes (ownership.MaxOwnerSize of them at most),
		// compared as Token.Compare does: text in utf8mb4_bin pads with
		// spaces when it compares, so "a" and "a " would be one owner.
		collate:  "binary",
		textType: "VARBINARY(255)",
		lock:     "SELECT epoch, owner, incarnation FROM %s WHERE partition_id = ? FOR UPDATE",
		// go-sql-driver/mysql prepares a statement with arguments
		// anyway (a round trip) unless interpolateParams is set.
		prepare: false,
		// An upsert that changes a row counts it twice.
		upsertTwice: true,
	}
}

// backticks re-quotes a table quoted by quoteTable for MySQL: its parts
// hold only letters, digits and underscores.
func backticks(table string) string { return strings.ReplaceAll(table, `"`, "`") }

// mysqlStatements is the SQL of one fence table in MySQL. An upsert there
// has no WHERE: each column is assigned IF(raise, new, old), and MySQL
// assigns left to right, each seeing the ones before. So the columns go
// in reverse order of the comparison (incarnation, owner, epoch): a
// column assigned early changes only the comparison of columns that are
// already equal to their new values (see the fence statement).
func mysqlStatements(table string) statements {
	table = backticks(table)
	// (epoch, owner, incarnation) < the new ones; owner and incarnation
	// compare bytewise (binary strings; the incarnation is hex).
	raise := "(epoch, owner, incarnation) < (VALUES(epoch), VALUES(owner), VALUES(incarnation))"
	return statements{
		table:   table,
		collate: MySQL().collate,
		schema: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	partition_id BIGINT NOT NULL PRIMARY KEY,
	epoch BIGINT NOT NULL CHECK (epoch > 0),
	owner VARBINARY(255) NOT NULL,
	incarnation CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (length(incarnation) = 16)
) ENGINE=InnoDB`, table),
		fence: fmt.Sprintf(`INSERT INTO %s (partition_id, epoch, owner, incarnation) VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
	incarnation = IF(%[2]s, VALUES(incarnation), incarnation),
	owner = IF(%[2]s, VALUES(owner), owner),
	epoch = IF(%[2]s, VALUES(epoch), epoch)`, table, raise),
		current: fmt.Sprintf(`SELECT epoch, owner, incarnation FROM %s WHERE partition_id = ?`, table),
		lock:    fmt.Sprintf(MySQL().lock, table),
		// A claim's epoch is seen+1 whether it inserts or updates, and it
		// updates only where the epoch is not above seen (epoch, last,
		// decides for the other two before it changes).
		claim: fmt.Sprintf(`INSERT INTO %s (partition_id, epoch, owner, incarnation) VALUES (?, ? + 1, ?, ?)
ON DUPLICATE KEY UPDATE
	incarnation = IF(epoch < VALUES(epoch), VALUES(incarnation), incarnation),
	owner = IF(epoch < VALUES(epoch), VALUES(owner), owner),
	epoch = IF(epoch < VALUES(epoch), VALUES(epoch), epoch)`, table),
	}
}

// claimCounted runs the claim where it returns no row (MySQL): its epoch
// is seen+1 if the upsert inserted or changed the row, and sql.ErrNoRows
// (a conflict) if it changed nothing.
func (a *Authority) claimCounted(ctx context.Context, p uint32, name, inc string, seen ownership.Token) (int64, error) {
	res, err := a.f.db.ExecContext(ctx, a.f.sql.claim, int64(p), int64(seen.Epoch), name, inc)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return 0, sql.ErrNoRows
	}
	return int64(seen.Epoch) + 1, nil
}

// mysqlRequests is the request table named table (quoted by quoteTable)
// in MySQL.
func mysqlRequests(table string, now func() time.Time) *Requests {
	t := backticks(table)
	// The id is bytes, compared as they are: text in utf8mb4_bin pads
	// with spaces when it compares ("k" = "k ") and can't hold every byte
	// string, so distinct ids would share a record.
	return &Requests{
		now:   now,
		maxID: 255,
		schema: `CREATE TABLE IF NOT EXISTS ` + t + ` (
	partition_id BIGINT NOT NULL,
	request_id VARBINARY(255) NOT NULL,
	result LONGBLOB NOT NULL,
	created_ms BIGINT NOT NULL,
	PRIMARY KEY (partition_id, request_id)) ENGINE=InnoDB`,
		// An update of nothing on a duplicate counts 0 rows, and waits,
		// like PostgreSQL's ON CONFLICT DO NOTHING, for a transaction that
		// inserted the same key and has not ended (INSERT IGNORE would
		// turn other errors into warnings, a truncated id among them).
		claim:    `INSERT INTO ` + t + ` (partition_id, request_id, result, created_ms) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE partition_id = partition_id`,
		lookup:   `SELECT result FROM ` + t + ` WHERE partition_id = ? AND request_id = ?`,
		record:   `UPDATE ` + t + ` SET result = ? WHERE partition_id = ? AND request_id = ?`,
		withdraw: `DELETE FROM ` + t + ` WHERE partition_id = ? AND request_id = ?`,
		forget:   `DELETE FROM ` + t + ` WHERE created_ms < ?`,
	}
}

// mysqlOffsets is the offset table of MySQL: its parameters are "?", so
// the UPDATE's come in the order they appear, and a partition's first
// commit inserts with ON DUPLICATE KEY UPDATE of nothing, which counts 0
// rows on a conflict (INSERT IGNORE would hide other errors too).
func mysqlOffsets(table string) *Offsets {
	t := backticks(table)
	return &Offsets{
		mysql: true,
		schema: `CREATE TABLE IF NOT EXISTS ` + t + ` (
	partition_id BIGINT NOT NULL PRIMARY KEY,
	next_offset BIGINT NOT NULL) ENGINE=InnoDB`,
		read:  `SELECT next_offset FROM ` + t + ` WHERE partition_id = ?`,
		move:  `UPDATE ` + t + ` SET next_offset = ? WHERE partition_id = ? AND next_offset = ?`,
		first: `INSERT INTO ` + t + ` (partition_id, next_offset) VALUES (?, ?) ON DUPLICATE KEY UPDATE partition_id = partition_id`,
	}
}
