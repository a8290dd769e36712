package kvnode_test

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// TestSQLiteClaimWaitsItsTurn (Linux, where the queue between processes
// is) is issue 20's starvation on a small scale:
// writers (each its own database handle, as each node process has one)
// commit fenced transactions into one SQLite file in a loop, and another
// handle claims a partition, as a new owner does, again and again. With
// SQLite's busy handler alone the claimant retried at ever longer
// intervals while the others committed in between: it was overtaken by
// dozens to hundreds of commits. With the write queue each other writer
// gets at most one turn before the claim: a burst of at most maxBurst
// commits (kvnode's), and its perWriter commits that landed just before
// the claim may be counted late. Without the queue most claims go straight
// through and about one in forty is starved, so the test makes up to 200
// claims and stops at the first one overtaken beyond the bound: 30 claims
// let that mutant pass one run in three.
func TestSQLiteClaimWaitsItsTurn(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	path := filepath.Join(t.TempDir(), "kv.db")
	const writers, perWriter, claims, maxBurst = 4, 2, 200, 8

	open := func() (*sql.DB, *sqlfence.Fence) {
		db, err := kvnode.OpenDB(path, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		f, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return db, f
	}
	db, claimant := open()
	if err := claimant.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE w (id INTEGER PRIMARY KEY AUTOINCREMENT, partition INTEGER NOT NULL, payload BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// The writers: one handle each, perWriter goroutines on a partition of
	// their own, as a node's Batcher flushes several partitions at once.
	var commits atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers*perWriter)
	payload := make([]byte, 512)
	for w := range writers {
		_, f := open()
		for g := range perWriter {
			p := uint32(1 + w*perWriter + g)
			tok, err := f.Authority().Claim(ctx, p, ownership.Node{Name: fmt.Sprintf("w%d", w), Incarnation: 1}, ownership.Token{})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := f.Do(ctx, tok, ownership.Exact, func(tx *sql.Tx) error {
						for range 4 {
							if _, err := tx.ExecContext(ctx, `INSERT INTO w (partition, payload) VALUES ($1, $2)`, int64(p), payload); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
					commits.Add(1)
				}
			}()
		}
	}
	defer func() {
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("writer: %v", err)
		}
	}()
	testkit.WaitFor(ctx, t, "the writers to commit", func() bool { return commits.Load() >= 50 })

	// The claims, on partition 0.
	var seen ownership.Token
	overtaken := make([]int64, 0, claims)
	node := ownership.Node{Name: "claimant", Incarnation: 1}
	bound := int64(writers * (maxBurst + perWriter))
	for range claims {
		before := commits.Load()
		tok, err := claimant.Authority().Claim(ctx, 0, node, seen)
		if err != nil {
			t.Fatal(err)
		}
		n := commits.Load() - before
		overtaken = append(overtaken, n)
		seen = tok
		if n > bound {
			t.Errorf("claim %d was overtaken by %d commits of %d other writers; want at most %d (one burst each): the writers don't take turns", len(overtaken), n, writers, bound)
			break
		}
	}
	t.Logf("commits overtaking each of %d claims: %v (%d writers)", len(overtaken), overtaken, writers)
}
