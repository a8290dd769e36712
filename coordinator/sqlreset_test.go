package coordinator

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// Issue 11, defect 6, further: after a fence table reset the SQL authority
// minted epoch 1 again (the first claim on a missing row), so a node that
// held a partition at epoch 1 was granted the very token it held before:
// two grants shared a token (S3), and a stale write of the first lease
// would pass the second's fence. And a grant below what gossip held never
// showed in the gossip register (its merge is max): Owner, Status and
// WaitConverged showed the old holder, released, forever. Every new lease
// has a new token, and gossip shows it.
func TestSQLAuthorityResetKeepsTokensUniqueAndVisible(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, f, _, db := sqlCluster(t)
	for i := range 3 {
		tc.start(ctx, fmt.Sprintf("u%d", i))
	}
	waitSQLOwned(ctx, t, tc, f)
	old := map[uint32]ownership.Token{}
	oldLease := map[uint32]*ownership.Lease{}
	for _, n := range tc.all() {
		for p := range uint32(testPartitions) {
			if l, err := n.c.LeaseOfPartition(p); err == nil {
				old[p], oldLease[p] = l.Token(), l
			}
		}
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM tenure_partitions`); err != nil {
		t.Fatal(err)
	}
	for _, n := range tc.all() {
		for p := range uint32(testPartitions) {
			if l, err := n.c.LeaseOfPartition(p); err == nil {
				n.c.ReportStale(f.Do(ctx, l.Token(), ownership.Exact, func(*sql.Tx) error { return nil }))
			}
		}
	}
	// A new lease is a new grant (another *Lease), not the old one before
	// its ReportStale reached the loop: the test used to accept a live old
	// lease here and then call its token a second grant (a false S3 under
	// load).
	testkit.WaitFor(ctx, t, "every partition's ring owner to hold a new lease", func() bool {
		for p := range old {
			n := tc.node(tc.all()[0].c.Table().Owner(p))
			if l, err := n.c.LeaseOfPartition(p); err != nil || l == oldLease[p] {
				return false
			}
		}
		return true
	})
	for _, n := range tc.all() {
		for p := range uint32(testPartitions) {
			if l, err := n.c.LeaseOfPartition(p); err == nil && l != oldLease[p] && l.Token().Same(old[p]) {
				t.Errorf("p%d: %s was granted %v again after the reset: two grants share a token", p, n.name, l.Token())
			}
		}
	}
	for _, n := range tc.all() {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := n.c.WaitConverged(wctx); err != nil {
			t.Errorf("%s: gossip never shows the new holders: %v (%s)", n.name, err, tc.why(n))
		}
		wcancel()
	}
}
