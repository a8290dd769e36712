package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// exampleDB opens a SQLite file in a new directory with an accounts
// table holding alice's; done closes it and removes the directory.
func exampleDB(ctx context.Context) (db *sql.DB, done func()) {
	dir, err := os.MkdirTemp("", "sqlfence-example")
	if err != nil {
		panic(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
		INSERT INTO accounts VALUES ('alice', 0)`); err != nil {
		panic(err)
	}
	return db, func() {
		db.Close()
		os.RemoveAll(dir)
	}
}

// Do runs fn in a transaction that commits only while the lease's token
// is the partition's mark: the check and the writes commit or fail
// together. DoConn is the same transaction with the check sent with
// BEGIN (one round trip less on PostgreSQL).
func ExampleFence_Do() {
	ctx := context.Background()
	db, done := exampleDB(ctx)
	defer done()
	// What Coordinator.Lease returns to the partition's owner.
	lease := ownership.NewLease(ctx, ownership.Token{Partition: 3, Epoch: 1, Owner: "node-1", Incarnation: 1})
	amount, id := 10, "alice"

	f, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{}) // sqlfence.Postgres() for PostgreSQL
	check(err)
	defer f.Close()
	check(f.CreateSchema(ctx))
	_, err = f.Fence(ctx, lease.Token()) // the coordinator does this before Acquire (Config.Fence)
	check(err)
	err = f.Do(ctx, lease.Token(), ownership.Exact, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, id)
		return err
	})
	fmt.Println("Do:", err)

	err = f.DoConn(ctx, lease.Token(), ownership.Exact, func(tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount, id)
		return err
	})
	fmt.Println("DoConn:", err)

	var balance int
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 'alice'`).Scan(&balance); err != nil {
		panic(err)
	}
	fmt.Println("alice:", balance)
	// Output:
	// Do: <nil>
	// DoConn: <nil>
	// alice: 20
}

// check stops an example at an error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}
