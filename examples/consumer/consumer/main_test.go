package consumer

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

// openSQLite opens a new SQLite file in the test's temporary directory.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "consumer.db")+
		"?_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openPostgres connects to TENURE_POSTGRES_DSN (default: the local test
// server) and fails the test if it can't.
func openPostgres(t *testing.T) *sql.DB {
	t.Helper()
	dsn := os.Getenv("TENURE_POSTGRES_DSN")
	if dsn == "" {
		dsn = defaultPostgresDSN
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open PostgreSQL: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("PostgreSQL is unreachable (set TENURE_POSTGRES_DSN); the test needs a server: %v", err)
	}
	db.SetMaxOpenConns(16)
	return db
}

// uniquePrefix returns a table prefix no other test uses; the tables are
// dropped when the test ends.
func uniquePrefix(t *testing.T, db *sql.DB, d sqlfence.Dialect) string {
	t.Helper()
	var b [5]byte
	rand.Read(b[:])
	prefix := "consumer_" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := NewStore(db, d, prefix)
		if err == nil {
			err = s.DropSchema(ctx)
		}
		if err != nil {
			t.Errorf("drop tables %s*: %v", prefix, err)
		}
	})
	return prefix
}

// newStore returns a store on db with a unique prefix and its schema
// created.
func newStore(t *testing.T, db *sql.DB, d sqlfence.Dialect) *Store {
	t.Helper()
	s, err := NewStore(db, d, uniquePrefix(t, db, d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}
