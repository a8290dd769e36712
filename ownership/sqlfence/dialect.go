package sqlfence

import (
	"errors"
	"fmt"
	"strings"
)

// A Dialect is the SQL a Fence speaks to one database engine. Get one from
// SQLite or Postgres; the zero Dialect is invalid.
//
// Both dialects use $1-style parameters, INSERT ... ON CONFLICT and
// RETURNING, so they need SQLite 3.35 or later (modernc.org/sqlite bundles
// it) and PostgreSQL 9.5 or later.
type Dialect struct {
	name string
	// collate makes text comparisons bytewise, as Token.Compare is.
	collate string
	// textType is the column type of owner and incarnation.
	textType string
	// lock is the statement, run first in a transaction, that locks the
	// partition's row against concurrent fences until the transaction ends
	// and returns its epoch, owner and incarnation. %s is the table.
	lock string
	// prepare: keep the lock statement prepared on each connection. The
	// pgx driver caches prepared statements itself, and drops them when
	// the table changes, which a *sql.Stmt would not; modernc.org/sqlite
	// parses every statement anew, which costs more than running it.
	prepare bool
}

// SQLite returns the dialect for SQLite, for example through the pure-Go
// driver modernc.org/sqlite (driver name "sqlite").
//
// SQLite has one writer at a time. Open the database in WAL mode with a
// busy timeout (with modernc.org/sqlite:
// "file:PATH?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"), so
// that a fence or write that finds the database locked waits instead of
// failing with SQLITE_BUSY.
func SQLite() Dialect {
	return Dialect{
		name:     "sqlite",
		collate:  "BINARY",
		textType: "TEXT",
		// A write as the first statement takes SQLite's write lock before
		// the transaction reads anything, so it is held from the check to
		// the commit and the transaction never sees a stale snapshot. The
		// unchanged row is not rewritten, so it costs no page write.
		lock:    `UPDATE %s SET epoch = epoch WHERE partition_id = $1 RETURNING epoch, owner, incarnation`,
		prepare: true,
	}
}

// Postgres returns the dialect for PostgreSQL, for example through
// github.com/jackc/pgx/v5/stdlib (driver name "pgx").
//
// Fenced transactions work at any isolation level; at REPEATABLE READ or
// SERIALIZABLE a fence that lands during a transaction makes it fail with a
// serialization error instead of a stale-token error.
func Postgres() Dialect {
	return Dialect{
		name:     "postgres",
		collate:  `"C"`,
		textType: `TEXT COLLATE "C"`,
		// FOR NO KEY UPDATE conflicts with every UPDATE of the row, so a
		// fence waits until the transaction ends; a transaction that waited
		// behind a fence reads the row as the fence left it.
		lock: `SELECT epoch, owner, incarnation FROM %s WHERE partition_id = $1 FOR NO KEY UPDATE`,
	}
}

// String returns "sqlite" or "postgres".
func (d Dialect) String() string {
	if d.name == "" {
		return "invalid dialect"
	}
	return d.name
}

// statements is the SQL of one fence table in one dialect.
type statements struct {
	schema     string
	fence      string
	current    string
	lock       string
	claim      string
	claimFirst string
}

func (d Dialect) statements(table string) statements {
	return statements{
		schema: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	partition_id BIGINT NOT NULL PRIMARY KEY,
	epoch BIGINT NOT NULL CHECK (epoch > 0),
	owner %s NOT NULL,
	incarnation %[2]s NOT NULL CHECK (length(incarnation) = 16)
)`, table, d.textType),
		// Advance the mark to the token if the token is higher; the row
		// comparison is Token.Compare.
		fence: fmt.Sprintf(`INSERT INTO %s AS f (partition_id, epoch, owner, incarnation)
VALUES ($1, $2, $3, $4)
ON CONFLICT (partition_id) DO UPDATE
SET epoch = excluded.epoch, owner = excluded.owner, incarnation = excluded.incarnation
WHERE (f.epoch, f.owner COLLATE %[2]s, f.incarnation COLLATE %[2]s)
	< (excluded.epoch, excluded.owner COLLATE %[2]s, excluded.incarnation COLLATE %[2]s)`, table, d.collate),
		current: fmt.Sprintf(`SELECT epoch, owner, incarnation FROM %s WHERE partition_id = $1`, table),
		lock:    fmt.Sprintf(d.lock, table),
		claim: fmt.Sprintf(`UPDATE %s SET epoch = epoch + 1, owner = $2, incarnation = $3
WHERE partition_id = $1 AND epoch = $4 RETURNING epoch`, table),
		claimFirst: fmt.Sprintf(`INSERT INTO %s (partition_id, epoch, owner, incarnation)
VALUES ($1, 1, $2, $3) ON CONFLICT (partition_id) DO NOTHING RETURNING epoch`, table),
	}
}

// DefaultTable is the fence table's name when Config.Table is empty.
const DefaultTable = "tenure_partitions"

// quoteTable checks that name is an identifier, optionally qualified by a
// schema ("name" or "schema.name", each part letters, digits and
// underscores, not starting with a digit, at most 63 bytes), and returns it
// quoted for SQL.
func quoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("sqlfence: table name %q: more than one dot", name)
	}
	for i, p := range parts {
		if err := checkIdent(p); err != nil {
			return "", fmt.Errorf("sqlfence: table name %q: %w", name, err)
		}
		parts[i] = `"` + p + `"`
	}
	return strings.Join(parts, "."), nil
}

func checkIdent(s string) error {
	if s == "" {
		return errors.New("empty identifier")
	}
	if len(s) > 63 {
		return errors.New("identifier longer than 63 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return fmt.Errorf("byte %q at %d: want letters, digits and underscores, not starting with a digit", c, i)
		}
	}
	return nil
}
