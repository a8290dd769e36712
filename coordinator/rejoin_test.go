package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"math/bits"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// rejoinersOf is how many of members rejoinDue lets re-join lost after it
// has been missing for missing: each member asks for itself, as the nodes
// of a cluster do.
func rejoinersOf(cfg Config, lost string, missing time.Duration, members map[string]ownership.Member) int {
	n := 0
	for name := range members {
		cfg.Name = name
		if rejoinDue(cfg, lost, missing, members) {
			n++
		}
	}
	return n
}

// Issue 22: a lost member is re-joined first by about log2(members)
// members (at least rejoinFanout), the same ones on every node, and by
// twice as many each RejoinInterval it stays missing, until every member
// tries. Every node re-joining every
// member it lost made a false death under load cost a whole register each
// way per node (hundreds during one start at 100 x 4096).
func TestRejoinDueDrawsAFewFirst(t *testing.T) {
	cfg := LocalConfig()
	after, every := rejoinAfter(cfg), cfg.RejoinInterval
	members := map[string]ownership.Member{}
	for i := range 100 {
		name := fmt.Sprintf("m%d", i)
		members[name] = ownership.Member{Name: name}
	}
	for _, c := range []struct {
		missing time.Duration
		want    int
	}{
		{after, 7}, // bits.Len(100)
		{after + every - time.Millisecond, 7},
		{after + every, 14},
		{after + 2*every, 28},
		{after + 3*every, 56},
		{after + 4*every, 100}, // 112 allowed: every member
		{after + time.Hour, 100},
	} {
		if got := rejoinersOf(cfg, "lost", c.missing, members); got != c.want {
			t.Errorf("missing %v (rejoinAfter %v, interval %v): %d members re-join, want %d", c.missing, after, every, got, c.want)
		}
	}
	// The first few differ from one lost member to the next, so the joins
	// of many losses spread over the members.
	first := map[string]bool{}
	for i := range 100 {
		lost := fmt.Sprintf("lost%d", i)
		for name := range members {
			cfg.Name = name
			if rejoinDue(cfg, lost, after, members) {
				first[name] = true
			}
		}
	}
	if len(first) < 50 {
		t.Errorf("the first re-joiners of 100 lost members are %d members of 100, want them spread over at least 50", len(first))
	}
	// A caller too early, or a RejoinInterval of zero, doesn't panic on a
	// negative shift and lets the first few through.
	if got := rejoinersOf(cfg, "lost", 0, members); got != 7 {
		t.Errorf("missing 0: %d members re-join, want 7", got)
	}
	cfg.RejoinInterval = 0
	if got := rejoinersOf(cfg, "lost", time.Hour, members); got != 7 {
		t.Errorf("RejoinInterval 0: %d members re-join, want 7", got)
	}
	// Small clusters: at least rejoinFanout first.
	three := map[string]ownership.Member{"a": {Name: "a"}, "b": {Name: "b"}, "c": {Name: "c"}}
	if got := rejoinersOf(LocalConfig(), "lost", after, three); got != rejoinFanout {
		t.Errorf("3 members: %d re-join first, want %d", got, rejoinFanout)
	}
}

// In a cluster: a crashed member is re-joined in the first round only by
// the members drawn first for it: three of six survivors (bits.Len(6)).
// Before the second round could start, none of the other three has tried,
// where without the draw each would have with a chance of three in four;
// then the first three all have. Times run from when the first
// survivor's gossip dropped the member (the loop marks it missing at
// once).
func TestRejoinFirstByTheDrawnFew(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, func(c *Config) {
		noTCPPings(c)
		c.RejoinInterval = 2 * time.Second
		c.Memberlist.GossipToTheDeadTime = time.Minute // rejoinAfter: two intervals
	})
	tc.startNodes(ctx, "r", 7)
	tc.waitConverged(ctx)
	const lost = "r3"
	before := map[string]uint64{}
	for _, n := range tc.all() {
		before[n.name] = counterValue(n.c.metrics.rejoins)
	}
	peer := tc.remove(lost)
	peer.c.Close() // nothing listens at its address: joins fail at once
	survivors := tc.all()
	// Times run from the first survivor whose gossip dropped the member:
	// no survivor's loop can have marked it missing before (but for the
	// polling's lag), so none can reach its second round sooner. The last
	// survivor to drop it may do so a second later, having missed the
	// member's death and found it by its own suspicion: measured from
	// then, members that dropped it first were in their second round at
	// the check (a CI run, under a load average of 2).
	var lostAt time.Time
	testkit.WaitFor(ctx, t, "every survivor's gossip to drop the crashed member", func() bool {
		gone := 0
		for _, n := range survivors {
			if _, ok := n.c.nodes.node(lost); !ok {
				gone++
			}
		}
		if gone > 0 && lostAt.IsZero() {
			lostAt = time.Now()
		}
		return gone == len(survivors)
	})
	slices.SortFunc(survivors, func(a, b *testNode) int {
		return cmp.Compare(rejoinRank(lost, a.name), rejoinRank(lost, b.name))
	})
	first := max(rejoinFanout, bits.Len(uint(len(survivors))))
	cfg := survivors[0].c.cfg
	after, every := rejoinAfter(cfg), cfg.RejoinInterval
	rejoins := func(n *testNode) uint64 { return counterValue(n.c.metrics.rejoins) - before[n.name] }
	// Three quarters into the first round: a measurement's time, not a
	// wait for a condition.
	select {
	case <-time.After(time.Until(lostAt.Add(after + every*3/4))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	for i, n := range survivors[first:] {
		if got := rejoins(n); got != 0 {
			t.Errorf("%s, drawn %d of %d for %s, re-joined it %d times within %v of its loss, before its turn (rejoinAfter %v + a round of %v)", n.name, first+i+1, len(survivors), lost, got, time.Since(lostAt), after, every)
		}
	}
	testkit.WaitFor(ctx, t, "the members drawn first to re-join the crashed member", func() bool {
		for _, n := range survivors[:first] {
			if rejoins(n) == 0 {
				return false
			}
		}
		return true
	})
}
