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

// sizePool keeps as many connections idle as it allows open: after every
// batch a node may run at once has put its connection back, none was
// closed. The negative control is database/sql's default, which keeps 2.
func TestSizePoolKeepsTheConnectionsIdle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc := Scenario{Nodes: 3, Partitions: 16}
	const want = 3*8 + 2
	for _, sized := range []bool{true, false} {
		db := openPostgres(t)
		db.SetMaxOpenConns(want)
		if sized {
			sizePool(db, sc)
		}
		conns := make([]*sql.Conn, want)
		for i := range conns {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns[i] = c
		}
		for _, c := range conns {
			c.Close()
		}
		st := db.Stats()
		switch {
		case sized && (st.MaxOpenConnections != want || st.Idle != want):
			t.Errorf("sized pool: %d open at most, %d idle; want %d and %d", st.MaxOpenConnections, st.Idle, want, want)
		case !sized && st.Idle != 2:
			t.Errorf("default pool: %d idle, want 2 (the negative control)", st.Idle)
		}
	}
}
