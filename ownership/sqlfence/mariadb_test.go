package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// defaultMySQLDSN is the MariaDB test server when TENURE_MYSQL_DSN is not
// set (.ci/mariadb starts it).
const defaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test"

// mysqlDSN is TENURE_MYSQL_DSN or defaultMySQLDSN.
func mysqlDSN() string {
	if dsn := os.Getenv("TENURE_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return defaultMySQLDSN
}

// mariadb is the MariaDB test server as a backend. Its sessions add
// ANSI_QUOTES to the server's sql_mode, so that the suite's own SQL (and
// uniqueName's DROP TABLE) may quote names with double quotes;
// TestMariaDBServerSQLMode shows the fence does not need it.
var mariadb = backend{name: "mariadb", dialect: sqlfence.MySQL(), autoID: "BIGINT AUTO_INCREMENT PRIMARY KEY",
	open: func(t testing.TB) *sql.DB {
		return withPool(openMySQL(t, "sql_mode="+url.QueryEscape("'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION,ANSI_QUOTES'")))
	}}

// withMariaDB is backends() and MariaDB.
func withMariaDB() []backend { return append(backends(), mariadb) }

// openMySQL opens the MariaDB test server with the DSN's parameters and
// params (k=v&...) added, and fails the test if it is unreachable.
func openMySQL(t testing.TB, params string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(mysqlDSN())
	if err != nil {
		t.Fatalf("TENURE_MYSQL_DSN: %v", err)
	}
	dsn := cfg.FormatDSN()
	if params != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + params
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open MariaDB: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("MariaDB at %s is unreachable (start it with .ci/mariadb, or set TENURE_MYSQL_DSN): %v", cfg.Addr, err)
	}
	return db
}

// The fence on MariaDB: a fence raises the mark and answers a lower token
// with the mark; Do commits under the mark only; Monotonic raises it; the
// authority mints dense epochs, loses a race with a conflict, jumps above
// what the claimant saw, and works above 2^31.
func TestMariaDBFence(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := mariadb.open(t)
	f, table := newFenceTable(t, db, mariadb.dialect, sqlfence.Config{})
	data := uniqueName(t, db, "data")
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+data+`" (id BIGINT PRIMARY KEY, epoch BIGINT)`); err != nil {
		t.Fatal(err)
	}
	e1, e2, e3 := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(1, 2, "b", 1), fencetest.Tok(1, 3, "c", 1)
	if cur, err := f.Current(ctx, 1); err != nil || !cur.IsZero() && cur.Epoch != 0 {
		t.Fatalf("Current of a new partition: %v, %v", cur, err)
	}
	for _, x := range []ownership.Token{e1, e2} {
		if got, err := f.Fence(ctx, x); err != nil || !got.Same(x) {
			t.Fatalf("Fence(%v) = %v, %v", x, got, err)
		}
	}
	if got, err := f.Fence(ctx, e2); err != nil || !got.Same(e2) {
		t.Fatalf("Fence again with the mark = %v, %v", got, err)
	}
	if _, err := f.Fence(ctx, e1); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("Fence with a lower token: %v; want stale", err)
	}
	// Same epoch, higher owner: raises (the comparison is bytewise, in order).
	e2b := fencetest.Tok(1, 2, "bb", 1)
	if got, err := f.Fence(ctx, e2b); err != nil || !got.Same(e2b) {
		t.Fatalf("Fence(%v) = %v, %v", e2b, got, err)
	}
	write := func(x ownership.Token, m ownership.Mode, id int) error {
		return f.Do(ctx, x, m, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+"`"+data+"`"+` (id, epoch) VALUES (?, ?)`, id, x.Epoch)
			return err
		})
	}
	if err := write(e2b, ownership.Exact, 1); err != nil {
		t.Fatal(err)
	}
	fencetest.WantStale(t, write(e2, ownership.Exact, 2), e2b)
	if err := write(e3, ownership.Exact, 3); !errors.Is(err, ownership.ErrNotFenced) {
		t.Fatalf("Exact write above the mark: %v; want ErrNotFenced", err)
	}
	if err := write(e3, ownership.Monotonic, 4); err != nil {
		t.Fatal(err)
	}
	if cur, err := f.Current(ctx, 1); err != nil || !cur.Same(e3) {
		t.Fatalf("mark after a Monotonic write under %v: %v, %v", e3, cur, err)
	}
	fencetest.WantStale(t, write(e2b, ownership.Monotonic, 5), e3)
	// A higher epoch with a lower owner and incarnation: every column
	// moves (MySQL assigns them one after another).
	e4 := fencetest.Tok(1, 4, "a", 0)
	if _, err := f.Fence(ctx, e4); err != nil {
		t.Fatal(err)
	}
	if cur, err := f.Current(ctx, 1); err != nil || !cur.Same(e4) {
		t.Fatalf("mark after Fence(%v): %v, %v", e4, cur, err)
	}
	var ids []int
	rs, err := db.QueryContext(ctx, `SELECT id FROM "`+data+`" ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id int
		rs.Scan(&id)
		ids = append(ids, id)
	}
	rs.Close()
	if fmt.Sprint(ids) != "[1 4]" {
		t.Fatalf("rows %v; want [1 4]", ids)
	}
	// DoConn is Do on MySQL.
	if err := f.DoConn(ctx, e4, ownership.Exact, func(tx sqlfence.Tx) error {
		if _, ok := tx.(*sql.Tx); !ok {
			return fmt.Errorf("DoConn handed fn a %T; want *sql.Tx", tx)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	a := f.Authority()
	n := ownership.Node{Name: "x", Incarnation: 7}
	t1, err := a.Claim(ctx, 2, n, ownership.Token{})
	if err != nil || t1.Epoch != 1 {
		t.Fatalf("first claim: %v, %v", t1, err)
	}
	t2, err := a.Claim(ctx, 2, ownership.Node{Name: "y", Incarnation: 1}, t1)
	if err != nil || t2.Epoch != 2 || t2.Owner != "y" {
		t.Fatalf("second claim: %v, %v", t2, err)
	}
	var conflict *sqlfence.ConflictError
	if _, err := a.Claim(ctx, 2, n, t1); !errors.As(err, &conflict) || !conflict.Current.Same(t2) {
		t.Fatalf("claim above a stale epoch: %v; want a conflict carrying %v", err, t2)
	}
	if cur, _ := f.Current(ctx, 2); !cur.Same(t2) {
		t.Fatalf("a lost claim moved the mark to %v", cur)
	}
	big := fencetest.Tok(2, 1<<33, "z", 1)
	t3, err := a.Claim(ctx, 2, n, big)
	if err != nil || t3.Epoch != 1<<33+1 {
		t.Fatalf("claim above 2^33: %v, %v", t3, err)
	}
	if err := f.Do(ctx, t3, ownership.Exact, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("Do under the claimed %v: %v", t3, err)
	}
	if table == "" {
		t.Fatal("no table name")
	}
}

// A fence waits for the fenced transactions holding its partition, so no
// write under an older token commits after it: writers under e1 race a
// fence of e2 (six rounds), and each row records the mark its own
// transaction read (a locking read, the latest) as it wrote: every one
// must be its own token's.
func TestMariaDBFenceWaitsForWriters(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := mariadb.open(t)
	f, table := newFenceTable(t, db, mariadb.dialect, sqlfence.Config{})
	data := uniqueName(t, db, "data")
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+data+`" (id BIGINT AUTO_INCREMENT PRIMARY KEY, epoch BIGINT, mark BIGINT)`); err != nil {
		t.Fatal(err)
	}
	// Rounds: writers under epoch r race a fence of epoch r+1.
	for r := uint64(1); r <= 6; r++ {
		cur, next := fencetest.Tok(1, r, "a", 1), fencetest.Tok(1, r+1, "a", 1)
		if r == 1 {
			fenced(t, f, cur)
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 200 {
					err := f.Do(ctx, cur, ownership.Exact, func(tx *sql.Tx) error {
						time.Sleep(time.Millisecond) // work between the check and the write
						_, err := tx.ExecContext(ctx, `INSERT INTO "`+data+`" (epoch, mark) SELECT ?, epoch FROM "`+table+`" WHERE partition_id = 1`, r)
						return err
					})
					if errors.Is(err, ownership.ErrStaleToken) {
						return
					} else if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "writes under the current token", func() bool {
			var n int
			db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+data+`" WHERE epoch = ?`, r).Scan(&n)
			return n > 5
		})
		fenced(t, f, next)
		wg.Wait()
	}
	var rows, stale int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(mark <> epoch), 0) FROM "`+data+`"`).Scan(&rows, &stale); err != nil {
		t.Fatal(err)
	}
	if rows == 0 || stale != 0 {
		t.Fatalf("%d rows, %d written while the mark was higher; want none", rows, stale)
	}
}

// Requests on MariaDB: a duplicate gets the first result and does not
// run, in a later transaction and on the next owner.
func TestMariaDBRequests(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := mariadb.open(t)
	f := newFence(t, db, mariadb.dialect)
	reqs := newRequests(t, db, mariadb.dialect, nil)
	var runs atomic.Int64
	once := func(x ownership.Token, id, result string) (string, bool, error) {
		var got []byte
		var dup bool
		err := f.Do(ctx, x, ownership.Exact, func(tx *sql.Tx) error {
			var err error
			got, dup, err = reqs.Once(ctx, tx, x.Partition, id, func() ([]byte, error) {
				runs.Add(1)
				return []byte(result), nil
			})
			return err
		})
		return string(got), dup, err
	}
	e1, e2 := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(1, 2, "b", 1)
	fenced(t, f, e1)
	if r, dup, err := once(e1, "r1", "first"); r != "first" || dup || err != nil {
		t.Fatalf("first write: %q %v %v", r, dup, err)
	}
	fenced(t, f, e2)
	if r, dup, err := once(e2, "r1", "second"); r != "first" || !dup || err != nil {
		t.Fatalf("duplicate on the next owner: %q %v %v", r, dup, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times; want 1", runs.Load())
	}
	if n, err := reqs.Forget(ctx, db, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Forget: %d, %v", n, err)
	}
}

// The fence works in the server's own sql_mode (no ANSI_QUOTES): its SQL
// quotes names MySQL's way.
func TestMariaDBServerSQLMode(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := openMySQL(t, "")
	var mode string
	if err := db.QueryRowContext(ctx, `SELECT @@SESSION.sql_mode`).Scan(&mode); err != nil || strings.Contains(mode, "ANSI_QUOTES") {
		t.Fatalf("sql_mode %q, %v; want the server's, without ANSI_QUOTES", mode, err)
	}
	name := "tenure_plain_" + fmt.Sprint(time.Now().UnixNano())
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + name + "`") })
	f, err := sqlfence.New(db, sqlfence.MySQL(), sqlfence.Config{Table: name})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := f.Authority().Claim(ctx, 5, ownership.Node{Name: "n", Incarnation: 1}, ownership.Token{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Do(ctx, x, ownership.Exact, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// Offsets on MariaDB (the MySQL dialect): Get, a first commit, the same
// batch again (ErrOffsetMoved, nothing applied), an empty batch (from ==
// next, which MySQL counts as 0 rows affected: not a moved offset), and a
// former owner's commit refused. (Before, NewOffsets accepted MySQL() and
// built PostgreSQL's SQL: every Get and Commit failed with a syntax error.)
func TestMariaDBOffsets(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := mariadb.open(t)
	f, _ := newFenceTable(t, db, mariadb.dialect, sqlfence.Config{})
	table := uniqueName(t, db, "tenure_offsets")
	o, err := sqlfence.NewOffsets(sqlfence.MySQL(), sqlfence.OffsetsConfig{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	effects := uniqueName(t, db, "tenure_effects")
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+effects+"` (event_offset BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	apply := func(from, next int64) func(sqlfence.Tx) error {
		return func(tx sqlfence.Tx) error {
			for off := from; off < next; off++ {
				if _, err := tx.ExecContext(ctx, "INSERT INTO `"+effects+"` (event_offset) VALUES (?)", off); err != nil {
					return err
				}
			}
			return nil
		}
	}
	applied := func() (n int) {
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+effects+"`").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	old, cur := fencetest.Tok(4, 1, "a", 1), fencetest.Tok(4, 2, "b", 1)
	if _, err := f.Fence(ctx, old); err != nil {
		t.Fatal(err)
	}
	if from, err := o.Get(ctx, db, 4); err != nil || from != 0 {
		t.Fatalf("Get before any commit = %d, %v; want 0", from, err)
	}
	if err := o.Commit(ctx, f, old, 0, 0, nil); err != nil {
		t.Fatalf("empty first commit: %v", err)
	}
	if err := o.Commit(ctx, f, old, 0, 3, apply(0, 3)); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	var moved *sqlfence.OffsetMovedError
	if err := o.Commit(ctx, f, old, 0, 3, apply(0, 3)); !errors.As(err, &moved) || moved.Current != 3 {
		t.Fatalf("commit of a committed batch = %v, want an *OffsetMovedError, current 3", err)
	}
	if err := o.Commit(ctx, f, old, 3, 3, nil); err != nil {
		t.Fatalf("empty batch at the committed offset = %v, want nil", err)
	}
	if err := o.Commit(ctx, f, old, 2, 2, nil); !errors.Is(err, sqlfence.ErrOffsetMoved) {
		t.Fatalf("empty batch at a stale offset = %v, want ErrOffsetMoved", err)
	}
	if _, err := f.Fence(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if err := o.Commit(ctx, f, old, 3, 5, apply(3, 5)); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("former owner's commit = %v, want a stale token error", err)
	}
	if err := o.Commit(ctx, f, cur, 3, 5, apply(3, 5)); err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
	if got, err := o.Get(ctx, db, 4); err != nil || got != 5 || applied() != 5 {
		t.Fatalf("offset %d (%v), %d events applied; want 5 and 5", got, err, applied())
	}
}

// Request ids on MariaDB are bytes, compared exactly: an id with a
// trailing space, one with a byte that is not UTF-8, and one that
// differs from another only past byte 255 are not duplicates of the ids
// they resemble. (Before, the ids were utf8mb4_bin text, which pads
// with spaces when it compares and which INSERT IGNORE truncated at an
// invalid byte or at 255 characters: "k " was answered with the result
// of "k" as a duplicate, never applied.) An id longer than 255 bytes is
// refused, nothing applied, even where the server's sql_mode is not
// strict and would truncate it (to the id of another write).
func TestMariaDBRequestIDsAreExact(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := withPool(openMySQL(t, "sql_mode="+url.QueryEscape("'NO_ENGINE_SUBSTITUTION,ANSI_QUOTES'")))
	f := newFence(t, db, mariadb.dialect)
	reqs := newRequests(t, db, mariadb.dialect, nil)
	x := fencetest.Tok(1, 1, "a", 1)
	fenced(t, f, x)
	once := func(id, result string) (string, bool, error) {
		var got []byte
		var dup bool
		err := f.Do(ctx, x, ownership.Exact, func(tx *sql.Tx) error {
			var err error
			got, dup, err = reqs.Once(ctx, tx, x.Partition, id, func() ([]byte, error) { return []byte(result), nil })
			return err
		})
		return string(got), dup, err
	}
	long := strings.Repeat("r", 255)
	for _, id := range []string{"k", "k ", "x\xff", "x?", "x", long, long[:254] + "s"} {
		if r, dup, err := once(id, "for "+id); r != "for "+id || dup || err != nil {
			t.Errorf("first write of id %q: %q, dup %v, %v; want it applied", id, r, dup, err)
		}
	}
	if r, dup, err := once("k ", "again"); r != "for k " || !dup || err != nil {
		t.Errorf("a duplicate of id %q: %q, dup %v, %v; want the first result", "k ", r, dup, err)
	}
	other := strings.Repeat("q", 255)
	if _, _, err := once(other+"t", ""); err == nil {
		t.Error("an id of 256 bytes accepted")
	}
	if r, dup, err := once(other, "for other"); r != "for other" || dup || err != nil {
		t.Errorf("first write of the 255-byte prefix of a refused id: %q, dup %v, %v; want it applied", r, dup, err)
	}
	if r, dup, err := once(long, "again"); r != "for "+long || !dup || err != nil {
		t.Errorf("a duplicate of the 255-byte id: %q, dup %v, %v; want the first result", r, dup, err)
	}
}

// The fence on MariaDB orders owner names bytewise, as Token.Compare
// does, trailing spaces included: a token of the same epoch whose owner
// is "a " is above one whose owner is "a", so fencing with it raises the
// mark and the former owner's writes are refused. (Before, the owner was
// utf8mb4_bin text, which pads with spaces when it compares: the fence
// saw the two as equal, kept "a" as the mark and answered the fence of
// "a " without an error, and "a" went on writing.)
func TestMariaDBFenceOrdersOwnersBytewise(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	db := mariadb.open(t)
	f := newFence(t, db, mariadb.dialect)
	low, high := fencetest.Tok(1, 5, "a", 1), fencetest.Tok(1, 5, "a ", 1)
	fenced(t, f, low)
	if mark, err := f.Fence(ctx, high); err != nil || mark != high {
		t.Fatalf("Fence(%v) = %v, %v; want it the mark", high, mark, err)
	}
	fencetest.WantStale(t, f.Do(ctx, low, ownership.Exact, func(*sql.Tx) error { return nil }), high)
	if err := f.Do(ctx, high, ownership.Exact, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("Do under the mark %v: %v", high, err)
	}
	if mark, err := f.Fence(ctx, low); !errors.Is(err, ownership.ErrStaleToken) || mark != high {
		t.Fatalf("Fence(%v) = %v, %v; want the stale token error and %v", low, mark, err, high)
	}
}
