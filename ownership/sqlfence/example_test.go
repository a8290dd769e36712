package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// An owner fences on acquire, then writes under its token; once a newer
// owner fences, the old owner's writes are refused.
func Example() {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()

	fence, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	if err != nil {
		panic(err)
	}
	defer fence.Close()
	if err := fence.CreateSchema(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER)`); err != nil {
		panic(err)
	}

	// The owner of partition 3 in epoch 1 fences before reading or writing.
	old := ownership.Token{Partition: 3, Epoch: 1, Owner: "node-a", Incarnation: 0x1a}
	if _, err := fence.Fence(ctx, old); err != nil {
		panic(err)
	}
	deposit := func(t ownership.Token, amount int) error {
		return fence.Do(ctx, t, ownership.Exact, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO balances VALUES ('alice', $1)
				ON CONFLICT (account) DO UPDATE SET amount = amount + excluded.amount`, amount)
			return err
		})
	}
	fmt.Println("node-a deposits:", deposit(old, 10))

	// node-b takes the partition over in epoch 2 and fences.
	next := ownership.Token{Partition: 3, Epoch: 2, Owner: "node-b", Incarnation: 0x2b}
	if _, err := fence.Fence(ctx, next); err != nil {
		panic(err)
	}
	// node-a, paused until now, tries again.
	err = deposit(old, 99)
	var stale *ownership.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("node-a refused; the partition belongs to", stale.Current.Owner)
	}
	fmt.Println("node-b deposits:", deposit(next, 5))

	var amount int
	if err := db.QueryRowContext(ctx, `SELECT amount FROM balances WHERE account = 'alice'`).Scan(&amount); err != nil {
		panic(err)
	}
	fmt.Println("alice:", amount)
	// Output:
	// node-a deposits: <nil>
	// node-a refused; the partition belongs to node-b
	// node-b deposits: <nil>
	// alice: 15
}

// The SQL authority mints dense epochs: a claim succeeds only from the
// epoch the table holds, and is itself a fence.
func ExampleFence_Authority() {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	fence, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	if err != nil {
		panic(err)
	}
	defer fence.Close()
	if err := fence.CreateSchema(ctx); err != nil {
		panic(err)
	}
	auth := fence.Authority()
	a := ownership.Node{Name: "node-a", Incarnation: 1}
	b := ownership.Node{Name: "node-b", Incarnation: 2}

	ta, err := auth.Claim(ctx, 7, a, ownership.Token{}) // nothing seen yet
	fmt.Println(ta.Epoch, ta.Owner, err)

	// node-b claims from a stale view and loses; it retries from the mark.
	_, err = auth.Claim(ctx, 7, b, ownership.Token{})
	var conflict *sqlfence.ConflictError
	if errors.As(err, &conflict) {
		tb, err := auth.Claim(ctx, 7, b, conflict.Current)
		fmt.Println(tb.Epoch, tb.Owner, err)
	}
	// Output:
	// 1 node-a <nil>
	// 2 node-b <nil>
}

// DoConn runs the same transaction as Do; fn gets a Tx, which has the
// statement methods of *sql.Tx. On PostgreSQL it saves Do's round trip
// for the check; on SQLite it is Do.
func ExampleFence_DoConn() {
	db, fence, done := exampleFence()
	defer done()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER)`); err != nil {
		panic(err)
	}
	owner := ownership.Token{Partition: 1, Epoch: 4, Owner: "node-a", Incarnation: 7}
	if _, err := fence.Fence(ctx, owner); err != nil {
		panic(err)
	}
	bump := func(t ownership.Token) error {
		return fence.DoConn(ctx, t, ownership.Exact, func(tx sqlfence.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO counters VALUES ('hits', 1)
				ON CONFLICT (name) DO UPDATE SET n = n + 1`)
			return err
		})
	}
	fmt.Println(bump(owner), bump(owner))
	older := owner
	older.Epoch = 3
	fmt.Println(errors.Is(bump(older), ownership.ErrStaleToken))
	// Output:
	// <nil> <nil>
	// true
}

// exampleFence opens a SQLite file in a new directory and a fence on it
// with its schema created; done closes both and removes the directory.
func exampleFence() (db *sql.DB, fence *sqlfence.Fence, done func()) {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		panic(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	if fence, err = sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{}); err != nil {
		panic(err)
	}
	if err := fence.CreateSchema(context.Background()); err != nil {
		panic(err)
	}
	return db, fence, func() {
		fence.Close()
		db.Close()
		os.RemoveAll(dir)
	}
}
