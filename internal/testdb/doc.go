// Package testdb opens the databases tenure's tests run against: a SQLite
// file of the test's own, and the PostgreSQL test server.
//
// Every handle is closed when the test ends. A test that needs PostgreSQL
// fails, never skips, when the server is unreachable: set
// TENURE_POSTGRES_DSN to point the tests at a server other than the
// default, postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
//
// Each call of Postgres or PostgresSchemaDSN creates a schema of the
// test's own, with a random name, and drops it when the test ends, so
// tests of parallel packages and of repeated runs never see each other's
// tables. PostgresPublic is for the test that must reopen the same tables
// through new handles; it connects to the server's default schema, shared
// with every other test, and its tables need names unique to the test.
//
// The package imports the pgx and SQLite database/sql drivers; only tests
// may import it.
package testdb
