package sqlfence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"iter"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// openSQLite opens a new SQLite file with synchronous(FULL), so that
// TestFigures weighs the fence against commits that wait for the disk.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	return withPool(testdb.SQLiteDurable(t, "fence.db"))
}

// openPostgres connects to the PostgreSQL test server's shared default
// schema, not one of the test's own: a test may open it again and must
// see the same tables, which uniqueName keeps apart from other tests'.
func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return withPool(testdb.PostgresPublic(t))
}

// withPool keeps up to 16 connections open and idle.
func withPool(db *sql.DB) *sql.DB {
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	return db
}

// path is one way of running a fenced transaction: Do or DoConn.
type path struct {
	name string
	do   func(f *sqlfence.Fence, ctx context.Context, t ownership.Token, m ownership.Mode, fn func(sqlfence.Tx) error) error
}

func paths() []path {
	return []path{
		{"do", func(f *sqlfence.Fence, ctx context.Context, t ownership.Token, m ownership.Mode, fn func(sqlfence.Tx) error) error {
			if fn == nil {
				return f.Do(ctx, t, m, nil)
			}
			return f.Do(ctx, t, m, func(tx *sql.Tx) error { return fn(tx) })
		}},
		{"conn", (*sqlfence.Fence).DoConn},
	}
}

// everyPath yields each backend with each path.
func everyPath() iter.Seq2[backend, path] {
	return func(yield func(backend, path) bool) {
		for _, b := range backends() {
			for _, via := range paths() {
				if !yield(b, via) {
					return
				}
			}
		}
	}
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
	f, _ := newFenceTable(t, db, d, sqlfence.Config{})
	return f
}

// newFenceTable is newFence configured by cfg (whose Table it sets) that
// also returns the table's name.
func newFenceTable(t testing.TB, db *sql.DB, d sqlfence.Dialect, cfg sqlfence.Config) (*sqlfence.Fence, string) {
	t.Helper()
	table := uniqueName(t, db, "tenure_fence")
	cfg.Table = table
	f, err := sqlfence.New(db, d, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx := testkit.Ctx(t, 60*time.Second)
	if err := f.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema: %v", err)
	}
	return f, table
}

// closeWhen closes c (a proxy between a test and its database) once done
// reports true, checking every 2 ms: a commit visible directly while its
// answer is still in the proxy loses that answer. The channel gets nil
// then, or ctx's error if ctx ends first (c is closed either way).
func closeWhen(ctx context.Context, c io.Closer, done func() bool) <-chan error {
	cut := make(chan error, 1)
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		var err error
		for err == nil && !done() {
			select {
			case <-tick.C:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		c.Close()
		cut <- err
	}()
	return cut
}
