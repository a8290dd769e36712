package coordinator

import (
	"slices"
	"time"
)

// quorum decides whether a node sees enough of the cluster to keep its
// leases (L4). The stable membership is the last member set that stayed
// unchanged for stableAfter and held a majority of the stable set before
// it; a node has a quorum when it sees a majority of the stable set (or at
// least min members when min > 0). Requiring each new stable set to hold a
// majority of the previous one means a minority cut off from the rest can
// never promote itself into a quorum by waiting.
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
	if q.stable == nil {
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

func (q *quorum) ok(members []string) bool {
	if q.min > 0 {
		return len(members) >= q.min
	}
	seen := 0
	for _, m := range q.stable {
		if _, found := slices.BinarySearch(members, m); found {
			seen++
		}
	}
	return 2*seen > len(q.stable)
}
