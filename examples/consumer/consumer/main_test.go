package consumer

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }

// openSQLite opens a new SQLite file in the test's temporary directory.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	return testdb.SQLite(t, "consumer.db")
}

// openPostgres connects to a schema of the test's own on the PostgreSQL
// test server, and fails the test if it can't.
func openPostgres(t *testing.T) *sql.DB {
	t.Helper()
	return testdb.Postgres(t)
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
