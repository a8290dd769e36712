package coordinator_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// openAccounts opens (or creates) a SQLite database at path with the
// fence's table and the service's own, and returns a fence on it.
func openAccounts(ctx context.Context, path string) (*sql.DB, *sqlfence.Fence, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, nil, err
	}
	fence, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	if err == nil {
		err = fence.CreateSchema(ctx)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, amount INTEGER NOT NULL)`)
	}
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, fence, nil
}

// deposit adds amount to account under lease: the token check and the
// update commit together, or not at all.
func deposit(ctx context.Context, fence *sqlfence.Fence, lease *ownership.Lease, account string, amount int) error {
	return fence.Do(ctx, lease.Token(), ownership.Exact, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = amount + excluded.amount`, account, amount)
		return err
	})
}

// balance reads account's balance.
func balance(ctx context.Context, db *sql.DB, account string) (int, error) {
	var amount int
	err := db.QueryRowContext(ctx, `SELECT amount FROM balances WHERE account = $1`, account).Scan(&amount)
	return amount, err
}

// A first service: one node that owns every partition, a SQLite database
// fenced by sqlfence, and a first fenced write.
func Example_service() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "tenure-service")
	check(err)
	defer os.RemoveAll(dir)

	db, fence, err := openAccounts(ctx, filepath.Join(dir, "app.db"))
	check(err)
	defer db.Close()

	cfg := coordinator.LocalConfig() // coordinator.LANConfig() on a real network
	cfg.Name = "node-1"
	cfg.Fence = fence // fenced with every new token before Acquire
	cfg.Handler = coordinator.HandlerFuncs{
		AcquireFunc: func(ctx context.Context, l *ownership.Lease) error {
			return nil // the fence is raised: load partition l.Partition()'s state here
		},
	}
	c, err := coordinator.New(cfg)
	check(err)
	check(c.Start(ctx)) // gossip, join, claim
	defer c.Close()
	check(c.WaitConverged(ctx))

	lease, err := c.Lease([]byte("alice")) // a *ownership.NotOwnerError names the owner
	check(err)
	fmt.Println("deposit:", deposit(ctx, fence, lease, "alice", 10))
	fmt.Println(balance(ctx, db, "alice"))
	check(c.Leave(ctx)) // hand off, then leave
	// Output:
	// deposit: <nil>
	// 10 <nil>
}

// check stops an example at an error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}

// TestDepositAfterFailover checks the service's write on a three-node
// cluster: an owner cut off with its clock stopped still holds its lease
// object, and its late deposit is refused; the new owner's goes in.
func TestDepositAfterFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, fence, err := openAccounts(ctx, filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cl, err := tenuretest.Start(ctx, tenuretest.Config{Nodes: 3, Fence: fence})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	key := []byte("alice")

	owner, err := cl.OwnerOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	old, err := cl.Node(owner).Lease(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := deposit(ctx, fence, old, "alice", 10); err != nil {
		t.Fatal(err)
	}
	if err := cl.Pause(owner); err != nil { // cut off, clock stopped
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx, cl.Live()...); err != nil { // the others took the key over
		t.Fatal(err)
	}
	if err := deposit(ctx, fence, old, "alice", 99); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("the cut-off owner's late deposit: %v, want ownership.ErrStaleToken", err)
	}
	next, err := cl.OwnerOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cl.Node(next).Lease(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := deposit(ctx, fence, lease, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if got, err := balance(ctx, db, "alice"); got != 15 || err != nil {
		t.Fatalf("balance %d, %v; want 15", got, err)
	}
	if err := cl.Resume(owner); err != nil {
		t.Fatal(err)
	}
}
