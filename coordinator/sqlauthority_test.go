package coordinator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// countingAuthority counts the claims made on an authority.
type countingAuthority struct {
	a      ownership.Authority
	claims atomic.Int64
}

func (c *countingAuthority) Strict() bool { return c.a.Strict() }

func (c *countingAuthority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	c.claims.Add(1)
	return c.a.Claim(ctx, p, n, seen)
}

// sqlCluster is a testCluster whose nodes fence a SQLite file and take
// their epochs from its fence table (the strict SQL authority).
func sqlCluster(t *testing.T) (*testCluster, *sqlfence.Fence, *countingAuthority, *sql.DB) {
	t.Helper()
	f, db := sqliteFence(t)
	auth := &countingAuthority{a: f.Authority()}
	tc := newTestCluster(t, func(c *Config) {
		c.Fence = f
		c.Authority = auth
		c.Grace = c.StepDown + c.TickInterval // crashes only: (almost) no grace needed
	})
	return tc, f, auth, db
}

// sqliteFence is a SQL fence on a new SQLite file, its table created.
func sqliteFence(t *testing.T) (*sqlfence.Fence, *sql.DB) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "fence.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, db
}

// waitSQLOwned waits until every node agrees on the table and every
// partition's ring owner holds a live lease whose token is the fence
// table's mark.
func waitSQLOwned(ctx context.Context, t *testing.T, tc *testCluster, f *sqlfence.Fence) {
	t.Helper()
	for {
		why := sqlOwned(ctx, tc, f)
		if why == "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not owned: %s", why)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func sqlOwned(ctx context.Context, tc *testCluster, f *sqlfence.Fence) string {
	nodes := tc.all()
	for _, n := range nodes {
		if tb := n.c.Table(); tb == nil || tb.Len() != len(nodes) || tb.Fingerprint() != nodes[0].c.Table().Fingerprint() {
			return n.name + " does not see every node"
		}
	}
	for p := range uint32(testPartitions) {
		owner := nodes[0].c.Table().Owner(p)
		cur, err := f.Current(ctx, p)
		if err != nil {
			return err.Error()
		}
		l, err := tc.node(owner).c.LeaseOfPartition(p)
		if err != nil || !cur.Same(l.Token()) {
			return fmt.Sprintf("p%d: mark %v, owner %s's lease %v (%v)", p, cur, owner, l, err)
		}
	}
	return ""
}

// Issue 11, defect 6: with the SQL authority, a claim that conflicted
// claimed again at once, forever, above max(holder, mark): after a fence
// table reset (or a restore, or any gossip epoch above the database's) no
// partition was ever claimed and the loop hammered the database. Claims go
// above the authority's answer and back off; a write that finds the mark
// below its token (ErrNotFenced) ends the lease, which is fenced anew.
func TestSQLAuthorityAfterFenceTableReset(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc, f, auth, db := sqlCluster(t)
	for i := range 3 {
		tc.start(ctx, fmt.Sprintf("q%d", i))
	}
	waitSQLOwned(ctx, t, tc, f)

	// The fence table is reset (a restore from an empty backup): the
	// gossiped epochs are now all above the database's.
	if _, err := db.ExecContext(ctx, `DELETE FROM tenure_partitions`); err != nil {
		t.Fatal(err)
	}
	before := auth.claims.Load()
	// Every owner's next write finds no mark: the lease ends and a new one
	// is fenced.
	var ended []*ownership.Lease
	for _, n := range tc.all() {
		for p := range uint32(testPartitions) {
			l, err := n.c.LeaseOfPartition(p)
			if err != nil {
				continue
			}
			werr := f.Do(ctx, l.Token(), ownership.Exact, func(*sql.Tx) error { return nil })
			if !errors.Is(werr, ownership.ErrNotFenced) {
				t.Fatalf("a write after the reset: %v, want ErrNotFenced", werr)
			}
			if !n.c.ReportStale(werr) {
				t.Fatalf("ReportStale(%v) = false", werr)
			}
			ended = append(ended, l)
		}
	}
	for _, l := range ended {
		if err := waitEnded(ctx, t, l, "a write found no fence"); !errors.Is(err, ownership.ErrLeaseNotFenced) {
			t.Fatalf("a lease whose write found no fence ended with %v, want ErrLeaseNotFenced", err)
		}
	}
	// And a node crashes: its partitions need new claims, above what the
	// database answers, not above what gossip shows.
	tc.remove("q1").c.Close()
	waitSQLOwned(ctx, t, tc, f)
	// One claim per partition, a few more for conflicts: never the
	// hammering of a claim every tick.
	if n := auth.claims.Load() - before; n > 4*testPartitions {
		t.Fatalf("%d claims to re-own %d partitions after the reset", n, testPartitions)
	} else {
		t.Logf("%d claims re-owned %d partitions after the reset", n, testPartitions)
	}
}
