package main

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/tenure-go/tenure/examples/consumer/consumer"
	"github.com/tenure-go/tenure/internal/leakcheck"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// openSQLite opens a new SQLite file in the test's temporary directory.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	return testdb.SQLite(t, "consumer.db")
}

// openPostgres connects to a schema of the test's own on the PostgreSQL
// test server, dropped when the test ends, and fails the test if it can't.
func openPostgres(t *testing.T) *sql.DB {
	t.Helper()
	return testdb.Postgres(t)
}

// newStore returns a store on db with its schema created.
func newStore(t *testing.T, db *sql.DB, d sqlfence.Dialect) *consumer.Store {
	t.Helper()
	s, err := consumer.NewStore(db, d, "")
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
