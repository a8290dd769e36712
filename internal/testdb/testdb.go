package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	_ "modernc.org/sqlite"           // the "sqlite" driver

	"github.com/tenure-go/tenure/internal/netdelay"
)

// DefaultPostgresDSN is the local test server, used when
// TENURE_POSTGRES_DSN is unset.
const DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const (
	// sqliteBusyTimeout is how long a SQLite writer waits for the lock
	// before it fails.
	sqliteBusyTimeout = 30 * time.Second
	// connectTimeout bounds connecting, creating and dropping a schema.
	connectTimeout = 10 * time.Second
	// maxPostgresConns caps each handle's connections, so that many
	// parallel tests stay below the server's max_connections.
	maxPostgresConns = 16
)

// SQLite opens a new SQLite file called name in t.TempDir(), in WAL mode
// with a 30 s busy timeout and synchronous(NORMAL): a commit survives a
// crash of the process, not of the machine. The handle's pool is
// database/sql's default; the test may set its limits.
func SQLite(t testing.TB, name string) *sql.DB {
	t.Helper()
	return openSQLite(t, name, "NORMAL")
}

// SQLiteDurable is SQLite with synchronous(FULL): every commit waits for
// fsync, as in a database that must survive the machine's crash. It is for
// tests that measure the cost of a commit.
func SQLiteDurable(t testing.TB, name string) *sql.DB {
	t.Helper()
	return openSQLite(t, name, "FULL")
}

func openSQLite(t testing.TB, name, synchronous string) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	db, err := sql.Open("sqlite", fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(%s)",
		path, sqliteBusyTimeout.Milliseconds(), synchronous))
	if err != nil {
		t.Fatalf("open SQLite %s: %v", path, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// PostgresDSN returns the DSN of the PostgreSQL test server:
// TENURE_POSTGRES_DSN, or DefaultPostgresDSN. source names it for
// messages without printing a password.
func PostgresDSN() (dsn, source string) {
	if dsn := os.Getenv("TENURE_POSTGRES_DSN"); dsn != "" {
		return dsn, "TENURE_POSTGRES_DSN"
	}
	return DefaultPostgresDSN, DefaultPostgresDSN + " (set TENURE_POSTGRES_DSN to use another server)"
}

// Postgres connects to a schema of the test's own on the PostgreSQL test
// server (see PostgresSchemaDSN), with at most 16 connections. It fails
// the test if the server is unreachable.
func Postgres(t testing.TB) *sql.DB {
	t.Helper()
	_, source := PostgresDSN()
	return openPostgres(t, PostgresSchemaDSN(t), source)
}

// PostgresPublic connects to the PostgreSQL test server's default schema,
// with at most 16 connections; every handle it returns in a test sees the
// same tables. Other tests and packages share that schema: the test must
// give its tables names of their own, and drop them. It fails the test if
// the server is unreachable.
func PostgresPublic(t testing.TB) *sql.DB {
	t.Helper()
	dsn, source := PostgresDSN()
	return openPostgres(t, dsn, source)
}

// PostgresPublicDelayed is PostgresPublic reached through a proxy on
// loopback that delays each direction by delay (see internal/netdelay): a
// round trip to the server takes 2*delay longer, as it would across a
// network. The proxy closes when the test ends.
func PostgresPublicDelayed(t testing.TB, delay time.Duration) *sql.DB {
	t.Helper()
	dsn, source := PostgresDSN()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse the PostgreSQL DSN from %s: %v", source, err)
	}
	p, err := netdelay.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), delay)
	if err != nil {
		t.Fatalf("delay proxy to PostgreSQL at %s: %v", source, err)
	}
	t.Cleanup(func() { p.Close() })
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(n), nil
	return ready(t, stdlib.OpenDB(*cfg), source+" through a delay proxy") // closed before the proxy
}

// PostgresSchemaDSN creates a schema with a unique name on the PostgreSQL
// test server, dropped with its tables when the test ends, and returns a
// DSN whose search_path is that schema, for code that opens its own
// connections. It fails the test if the server is unreachable.
func PostgresSchemaDSN(t testing.TB) string {
	t.Helper()
	dsn, source := PostgresDSN()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "tenure_test_" + hex.EncodeToString(b[:])
	admin := openPostgres(t, dsn, source)
	admin.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema %s on PostgreSQL at %s: %v", schema, source, err)
	}
	// Registered after admin's Close, so it runs before it, and after the
	// cleanups of the test's own handles.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	if !strings.Contains(dsn, "://") { // keyword/value form
		return dsn + " search_path=" + schema
	}
	u, err := url.Parse(dsn)
	if err != nil { // not err itself: it quotes the DSN, password and all
		t.Fatalf("the PostgreSQL DSN from %s is not a valid URL", source)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// openPostgres connects to dsn, closed when the test ends, and fails the
// test if the server doesn't answer a ping.
func openPostgres(t testing.TB, dsn, source string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open PostgreSQL at %s: %v", source, err)
	}
	return ready(t, db, source)
}

// ready closes db when the test ends, caps its connections and fails the
// test if the server doesn't answer a ping.
func ready(t testing.TB, db *sql.DB, source string) *sql.DB {
	t.Helper()
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(maxPostgresConns)
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s is unreachable; the test needs a server: %v", source, err)
	}
	return db
}
