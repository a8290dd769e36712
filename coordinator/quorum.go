package coordinator

import (
	"slices"
	"time"
)

// quorum decides whether a node sees enough of the cluster to keep its
// leases (L4). The stable membership is what quorum is counted against; a
// node has a quorum when it sees a majority of it (or at least min members
// when min > 0). The stable membership follows the view in three ways:
//
//   - at once when the view holds all of it (a join): a superset can't be a
//     minority of anything;
//   - at once without a member that left gracefully (forget): it said
//     goodbye, it is not missing;
//   - otherwise only after the view stayed unchanged for stableAfter and
//     held a majority of the stable set before it. A minority cut off from
//     the rest loses sight of the others one at a time; with stableAfter
//     longer than that spread it can never promote itself into a quorum.
type quorum struct {
	min         int
	stableAfter time.Duration

	stable    []string // sorted
	candidate []string // sorted
	since     time.Time
}

// check records the members seen now (sorted, self included) and reports
// whether they form a quorum.
func (q *quorum) check(now time.Time, members []string) bool {
	if q.stable == nil || (!slices.Equal(q.stable, members) && containsAll(members, q.stable)) {
		q.stable = slices.Clone(members)
	}
	if !slices.Equal(members, q.candidate) {
		q.candidate = slices.Clone(members)
		q.since = now
	}
	ok := q.ok(members)
	if ok && !slices.Equal(q.stable, members) && now.Sub(q.since) >= q.stableAfter {
		q.stable = slices.Clone(members)
	}
	return ok
}

// forget removes a member that left gracefully from the stable membership.
func (q *quorum) forget(name string) {
	if i, found := slices.BinarySearch(q.stable, name); found {
		q.stable = slices.Delete(slices.Clone(q.stable), i, i+1)
	}
}

func (q *quorum) ok(members []string) bool {
	if q.min > 0 {
		return len(members) >= q.min
	}
	return 2*countIn(q.stable, members) > len(q.stable)
}

// countIn counts the names of sub found in sorted set.
func countIn(sub, set []string) int {
	n := 0
	for _, m := range sub {
		if _, found := slices.BinarySearch(set, m); found {
			n++
		}
	}
	return n
}

func containsAll(set, sub []string) bool { return countIn(sub, set) == len(sub) }
