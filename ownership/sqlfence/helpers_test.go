package sqlfence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// postgresDSN is where the PostgreSQL tests connect: TENURE_POSTGRES_DSN, or
// the local test server. where names it for messages without printing a
// password.
func postgresDSN() (dsn, where string) {
	if dsn := os.Getenv("TENURE_POSTGRES_DSN"); dsn != "" {
		return dsn, "TENURE_POSTGRES_DSN"
	}
	return defaultPostgresDSN, defaultPostgresDSN + " (set TENURE_POSTGRES_DSN to use another server)"
}

// backend is one database engine the suite runs against.
type backend struct {
	name    string
	dialect sqlfence.Dialect
	// open returns a fresh database handle, closed when the test ends.
	open func(t testing.TB) *sql.DB
	// autoID is the column type of an auto-increment primary key.
	autoID string
}

func backends() []backend {
	return []backend{
		{name: "sqlite", dialect: sqlfence.SQLite(), open: openSQLite, autoID: "INTEGER PRIMARY KEY AUTOINCREMENT"},
		{name: "postgres", dialect: sqlfence.Postgres(), open: openPostgres, autoID: "BIGSERIAL PRIMARY KEY"},
	}
}

// openSQLite opens a new SQLite file in the test's temporary directory.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	return db
}

// openPostgres connects to the PostgreSQL server named by
// TENURE_POSTGRES_DSN and fails the test if it can't.
func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	dsn, where := postgresDSN()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open PostgreSQL at %s: %v", where, err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s is unreachable; the tests need a server: %v", where, err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	return db
}

// uniqueName returns a table name no other test uses, and drops the table
// when the test ends.
func uniqueName(t testing.TB, db *sql.DB, prefix string) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := prefix + "_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS "`+name+`"`); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// newFence returns a fence on a fresh table of db with its schema created.
func newFence(t testing.TB, db *sql.DB, d sqlfence.Dialect) *sqlfence.Fence {
	t.Helper()
	f, _ := newFenceTable(t, db, d)
	return f
}

// newFenceTable is newFence that also returns the table's name.
func newFenceTable(t testing.TB, db *sql.DB, d sqlfence.Dialect) (*sqlfence.Fence, string) {
	t.Helper()
	table := uniqueName(t, db, "tenure_fence")
	f, err := sqlfence.New(db, d, sqlfence.Config{Table: table})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx, cancel := testContext(t)
	defer cancel()
	if err := f.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema: %v", err)
	}
	return f, table
}

// testContext bounds a test's database calls.
func testContext(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}
