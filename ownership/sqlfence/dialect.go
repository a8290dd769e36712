package sqlfence

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tenure-go/tenure/ownership"
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
	// gate: the engine has advisory locks. Fences and claims take one on
	// the partition exclusively before they lock its row, and shared
	// checks (Config.Concurrent) take it shared first: a shared row lock
	// lets new sharers in past a waiting fence, the advisory lock queues
	// them behind it. Without a gate there are no shared checks.
	gate bool
	// prepare: keep the lock statement prepared on each connection. The
	// pgx driver caches prepared statements itself, and drops them when
	// the table changes, which a *sql.Stmt would not; modernc.org/sqlite
	// parses every statement anew, which costs more than running it.
	prepare bool
	// oneTrip: DoConn sends BEGIN and the check as one message of
	// statements without parameters (PostgreSQL's simple query protocol),
	// the token written as literals, and learns the outcome from the
	// number of rows the last statement returned. Otherwise DoConn is Do.
	oneTrip bool
	// upsertTwice: an upsert that updates a row reports 2 rows affected
	// (MySQL), one that inserts 1.
	upsertTwice bool
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
//
// Fences, claims and Monotonic raises take a transaction-level advisory
// lock on the partition before they lock its row, exclusively, and the
// checks of a Concurrent fence take it shared: key oid<<32 | partition in
// the one-bigint key space, oid the fence table's. An advisory lock of
// yours on such a key only makes one side wait.
func Postgres() Dialect {
	return Dialect{
		name:     "postgres",
		collate:  `"C"`,
		textType: `TEXT COLLATE "C"`,
		// FOR NO KEY UPDATE conflicts with every UPDATE of the row, so a
		// fence waits until the transaction ends; a transaction that waited
		// behind a fence reads the row as the fence left it.
		lock:    `SELECT epoch, owner, incarnation FROM %s WHERE partition_id = $1 FOR NO KEY UPDATE`,
		gate:    true,
		oneTrip: true,
	}
}

// String returns "sqlite", "postgres" or "mysql".
func (d Dialect) String() string {
	if d.name == "" {
		return "invalid dialect"
	}
	return d.name
}

// statements is the SQL of one fence table in one dialect.
type statements struct {
	table   string
	collate string
	schema  string
	fence   string
	current string
	lock    string
	share   string // the shared lock (Config.Concurrent), "" without a gate

	gatedLock string // lock under the advisory lock (Monotonic), "" without a gate
	check     string // the shared check, "" without a gate
	claim     string
}

func (d Dialect) statements(table string) statements {
	if d.name == "mysql" {
		return mysqlStatements(table)
	}
	return statements{
		table:   table,
		collate: d.collate,
		schema: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	partition_id BIGINT NOT NULL PRIMARY KEY,
	epoch BIGINT NOT NULL CHECK (epoch > 0),
	owner %s NOT NULL,
	incarnation %[2]s NOT NULL CHECK (length(incarnation) = 16)
)`, table, d.textType),
		fence: fmt.Sprintf(`INSERT INTO %s AS f (partition_id, epoch, owner, incarnation)
%s
ON CONFLICT (partition_id) DO UPDATE
SET epoch = excluded.epoch, owner = excluded.owner, incarnation = excluded.incarnation
WHERE (f.epoch, f.owner COLLATE %[3]s, f.incarnation COLLATE %[3]s)
	< (excluded.epoch, excluded.owner COLLATE %[3]s, excluded.incarnation COLLATE %[3]s)`,
			table, d.gated(table, "$1", "$2", "$3", "$4"), d.collate),
		current:   fmt.Sprintf(`SELECT epoch, owner, incarnation FROM %s WHERE partition_id = $1`, table),
		lock:      fmt.Sprintf(d.lock, table),
		share:     d.shared(table, "f.epoch, f.owner, f.incarnation", ""),
		gatedLock: d.underGate(table, "f.epoch, f.owner, f.incarnation", "", "pg_advisory_xact_lock", "NO KEY UPDATE"),
		check:     d.shared(table, "1", "\n\tAND f.epoch = $2 AND f.owner COLLATE "+d.collate+" = $3 AND f.incarnation COLLATE "+d.collate+" = $4"),
		claim: fmt.Sprintf(`INSERT INTO %s AS f (partition_id, epoch, owner, incarnation)
%s
ON CONFLICT (partition_id) DO UPDATE
SET epoch = excluded.epoch, owner = excluded.owner, incarnation = excluded.incarnation
WHERE f.epoch <= $4
RETURNING epoch`, table, d.gated(table, "$1", d.bigint("$4")+" + 1", "$2", "$3")),
	}
}

// gateKey is the advisory lock key of partition $1 of table (see
// Postgres): made from the table's OID, so that fences naming one table
// differently (qualified or not) share it. table is quoted (see
// quoteTable), so it holds no single quote.
func gateKey(table string) string {
	return fmt.Sprintf("('%s'::regclass::oid::bigint << 32 | $1::bigint)", table)
}

// bigint is param typed BIGINT where the engine infers parameter types
// from their first use (PostgreSQL: "$4 + 1" would make $4 an integer).
func (d Dialect) bigint(param string) string {
	if d.gate {
		return param + "::bigint"
	}
	return param
}

// gated is the row an INSERT into the fence table inserts, given its four
// values (partition, epoch, owner, incarnation): with a gate, selected
// under the partition's advisory lock, taken exclusively before the
// INSERT locks the partition's row.
func (d Dialect) gated(table, p, epoch, owner, inc string) string {
	if !d.gate {
		return "VALUES (" + p + ", " + epoch + ", " + owner + ", " + inc + ")"
	}
	return fmt.Sprintf("SELECT (%s)::bigint, (%s)::bigint, (%s)::text, (%s)::text FROM (SELECT pg_advisory_xact_lock(%s)) AS tenure_gate",
		p, epoch, owner, inc, gateKey(table))
}

// shared is the shared check of partition $1, returning cols of its row
// (as f) where cond holds, "" without a gate. FOR SHARE, not FOR KEY
// SHARE: it must conflict with the fence's NO KEY UPDATE.
func (d Dialect) shared(table, cols, cond string) string {
	return d.underGate(table, cols, cond, "pg_advisory_xact_lock_shared", "SHARE")
}

// underGate selects cols of partition $1's row (as f) where cond holds,
// locked in mode, out of a join with the partition's advisory lock taken
// by lockFn; "" without a gate. The row is locked above that join, so the
// advisory lock is always taken first: a sharer waits behind a fence that
// waits for the advisory lock, instead of joining the row's shared lock
// past it, and nothing holds the row while it waits for the gate.
func (d Dialect) underGate(table, cols, cond, lockFn, mode string) string {
	if !d.gate {
		return ""
	}
	return fmt.Sprintf(`SELECT %s FROM %s AS f, (SELECT %s(%s)) AS tenure_gate
WHERE f.partition_id = $1%s FOR %s OF f`, cols, table, lockFn, gateKey(table), cond, mode)
}

// checkSQL locks partition $1's row exclusively (NO KEY UPDATE) and
// returns it if the mark is the token ($2, $3, $4): a row returned means
// the transaction holds the partition under that token.
func (s statements) checkSQL() string {
	return fmt.Sprintf(`SELECT 1 FROM %[1]s WHERE partition_id = $1 AND epoch = $2
	AND owner COLLATE %[2]s = $3 AND incarnation COLLATE %[2]s = $4 FOR NO KEY UPDATE`, s.table, s.collate)
}

// prepared names the server-side prepared statements DoConn runs on
// PostgreSQL for this table: a digest of the table's name, so that fences
// of two tables never run each other's statements.
func (s statements) prepared(kind string) string {
	sum := sha256.Sum256([]byte(s.table))
	return "tenure_" + kind + "_" + hex.EncodeToString(sum[:12])
}

// prepare is what DoConn sends, once per connection, to prepare its
// statements on PostgreSQL: the checks (exclusive and shared) and the
// fence statement.
func (s statements) prepare() []string {
	const params = "(BIGINT, BIGINT, TEXT, TEXT)"
	return []string{
		"PREPARE " + s.prepared("check") + " " + params + " AS " + s.checkSQL(),
		"PREPARE " + s.prepared("share") + " " + params + " AS " + s.check,
		"PREPARE " + s.prepared("raise") + " " + params + " AS " + s.fence,
	}
}

// beginCheck is the message DoConn sends first on PostgreSQL: BEGIN; in
// Monotonic mode the fence statement, which locks the row whether or not
// it raises the mark; and the check, which returns a row only if the mark
// is t (under a shared lock if shared, in Exact mode). The statements are
// prepared (see prepare): a message of several statements is parsed and
// planned anew each time, which costs more than the round trip it saves.
//
// A message of several statements takes no parameters, so the token goes
// in as literals: numbers in decimal, the incarnation in hex, and the
// owner quoted if it holds only letters, digits and "-_.:/@", else as hex
// that the server decodes, so no byte of a name is ever read as SQL.
func (s statements) beginCheck(t ownership.Token, m ownership.Mode, shared bool) string {
	args := "(" + strconv.FormatUint(uint64(t.Partition), 10) + ", " + strconv.FormatUint(t.Epoch, 10) +
		", " + ownerLiteral(t.Owner) + ", '" + incarnationText(t.Incarnation) + "')"
	msg := "BEGIN; "
	check := "check"
	if m == ownership.Monotonic {
		msg += "EXECUTE " + s.prepared("raise") + args + "; "
	} else if shared {
		check = "share"
	}
	return msg + "EXECUTE " + s.prepared(check) + args
}

// ownerLiteral is owner as a SQL expression of type text.
func ownerLiteral(owner string) string {
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		plain := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:/@", c) >= 0
		if !plain {
			return "convert_from(decode('" + hex.EncodeToString([]byte(owner)) + "', 'hex'), 'UTF8')"
		}
	}
	return "'" + owner + "'"
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
