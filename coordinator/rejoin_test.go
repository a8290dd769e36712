package coordinator

import (
	"context"
	"fmt"
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

// Issue 22: a lost member is re-joined first by rejoinFanout members, the
// same ones on every node, and by twice as many each RejoinInterval it
// stays missing, until every member tries. Every node re-joining every
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
		{after, rejoinFanout},
		{after + every - time.Millisecond, rejoinFanout},
		{after + every, 2 * rejoinFanout},
		{after + 2*every, 4 * rejoinFanout},
		{after + 5*every, 64},
		{after + 6*every, 100}, // 128 allowed: every member
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
	if got := rejoinersOf(cfg, "lost", 0, members); got != rejoinFanout {
		t.Errorf("missing 0: %d members re-join, want %d", got, rejoinFanout)
	}
	cfg.RejoinInterval = 0
	if got := rejoinersOf(cfg, "lost", time.Hour, members); got != rejoinFanout {
		t.Errorf("RejoinInterval 0: %d members re-join, want %d", got, rejoinFanout)
	}
}

// In a cluster: a crashed member is re-joined in the first round only by
// the members drawn first for it; the last drawn of six survivors have not
// tried a RejoinInterval after the first could, while every survivor
// would have without the draw.
func TestRejoinFirstByTheDrawnFew(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, func(c *Config) {
		noTCPPings(c)
		c.RejoinInterval = time.Second // rejoinAfter 2 s: room for skew
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
	testkit.WaitFor(ctx, t, "every survivor to drop the crashed member", func() bool {
		for _, n := range survivors {
			if n.c.Table().Has(lost) {
				return false
			}
		}
		return true
	})
	lostAt := time.Now() // at or after every survivor's loop saw it go
	slices.SortFunc(survivors, func(a, b *testNode) int {
		ra, rb := rejoinRank(lost, a.name), rejoinRank(lost, b.name)
		if ra < rb {
			return -1
		}
		if ra > rb {
			return 1
		}
		return 0
	})
	cfg := survivors[0].c.cfg
	after, every := rejoinAfter(cfg), cfg.RejoinInterval
	// By rejoinAfter plus a round and a margin, every survivor's first
	// rejoin round has come: without the draw each has joined once. The
	// last two drawn may not before two rounds past rejoinAfter.
	select {
	case <-time.After(time.Until(lostAt.Add(after + every + 300*time.Millisecond))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	for i, n := range survivors {
		got := counterValue(n.c.metrics.rejoins) - before[n.name]
		switch {
		case i < rejoinFanout && got == 0:
			t.Errorf("%s, drawn %d of %d for %s, has not re-joined it %v after its loss", n.name, i+1, len(survivors), lost, time.Since(lostAt))
		case i >= 2*rejoinFanout && got != 0:
			t.Errorf("%s, drawn %d of %d for %s, re-joined it %d times within %v of its loss, before its turn (rejoinAfter %v + 2 rounds of %v)", n.name, i+1, len(survivors), lost, got, time.Since(lostAt), after, every)
		}
	}
}
