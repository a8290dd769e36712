package testdb_test

import (
	"database/sql"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSQLite(t *testing.T) {
	for _, c := range []struct {
		open func(testing.TB, string) *sql.DB
		sync int // PRAGMA synchronous: 1 NORMAL, 2 FULL
	}{{testdb.SQLite, 1}, {testdb.SQLiteDurable, 2}} {
		ctx := testkit.Ctx(t, 30*time.Second)
		db := c.open(t, "x.db")
		var mode string
		var sync, busy int
		if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("journal_mode = %q, %v; want wal", mode, err)
		}
		if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil || sync != c.sync {
			t.Errorf("synchronous = %d, %v; want %d", sync, err, c.sync)
		}
		if err := db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 30000 {
			t.Errorf("busy_timeout = %d, %v; want 30000", busy, err)
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE t (k TEXT)"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPostgresSchema: each call gets a schema of its own, every connection
// of a handle uses it, and it is gone when the test ends.
func TestPostgresSchema(t *testing.T) {
	ctx := testkit.Ctx(t, 30*time.Second)
	var schemas []string
	t.Run("own", func(t *testing.T) {
		a, b := testdb.Postgres(t), testdb.Postgres(t)
		for _, db := range []*sql.DB{a, b} {
			// Two connections at once: both must see the schema.
			c1, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			c2, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			var s1, s2 string
			if err := c1.QueryRowContext(ctx, "SELECT current_schema()").Scan(&s1); err != nil {
				t.Fatal(err)
			}
			if err := c2.QueryRowContext(ctx, "SELECT current_schema()").Scan(&s2); err != nil {
				t.Fatal(err)
			}
			if s1 != s2 || !strings.HasPrefix(s1, "tenure_test_") {
				t.Fatalf("current_schema = %q and %q, want one tenure_test_ schema", s1, s2)
			}
			if _, err := c1.ExecContext(ctx, "CREATE TABLE same_name (k TEXT)"); err != nil {
				t.Fatal(err)
			}
			schemas = append(schemas, s1)
		}
		if schemas[0] == schemas[1] {
			t.Fatalf("two handles share schema %s", schemas[0])
		}
	})
	if len(schemas) != 2 {
		t.FailNow()
	}
	db := testdb.PostgresPublic(t)
	var public string
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&public); err != nil || public != "public" {
		t.Errorf("PostgresPublic: current_schema = %q, %v; want public", public, err)
	}
	for _, s := range schemas {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", s).Scan(&n); err != nil || n != 0 {
			t.Errorf("schema %s: %d left after the test, %v", s, n, err)
		}
	}
}

// TestPostgresSchemaDSN: the DSN reaches the test's schema through a
// handle the test opens itself, in the URL and (on the default server)
// the keyword/value form.
func TestPostgresSchemaDSN(t *testing.T) {
	dsns := []string{testdb.DefaultPostgresDSN, "host=127.0.0.1 port=5432 user=postgres dbname=test sslmode=disable"}
	if dsn, source := testdb.PostgresDSN(); dsn != testdb.DefaultPostgresDSN {
		t.Logf("testing only the server at %s", source)
		dsns = []string{dsn}
	}
	for _, dsn := range dsns {
		t.Run("", func(t *testing.T) {
			t.Setenv("TENURE_POSTGRES_DSN", dsn)
			if got, source := testdb.PostgresDSN(); got != dsn || source != "TENURE_POSTGRES_DSN" {
				t.Fatalf("PostgresDSN() = %q, %q", got, source)
			}
			ctx := testkit.Ctx(t, 30*time.Second)
			db, err := sql.Open("pgx", testdb.PostgresSchemaDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var s string
			if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&s); err != nil || !strings.HasPrefix(s, "tenure_test_") {
				t.Fatalf("current_schema = %q, %v", s, err)
			}
		})
	}
}

// TestPostgresUnreachable: a test whose server is down fails, and the
// message names where the DSN came from.
func TestPostgresUnreachable(t *testing.T) {
	t.Setenv("TENURE_POSTGRES_DSN", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testdb.Postgres(ft)
	}()
	<-done
	if !strings.Contains(ft.msg, "TENURE_POSTGRES_DSN") || !strings.Contains(ft.msg, "unreachable") {
		t.Fatalf("failure message %q, want one naming TENURE_POSTGRES_DSN as unreachable", ft.msg)
	}
}

// fatalT records the message of Fatalf and ends the goroutine, as
// testing.T does, without failing the real test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
