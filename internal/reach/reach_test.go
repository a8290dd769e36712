package reach

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// local is the coordinator's local preset: ProbeInterval 200 ms,
// ProbeTimeout 100 ms, reachSpan 1.5 s, reachHold 5 s.
var local = Config{
	Interval: 200 * time.Millisecond, Timeout: 100 * time.Millisecond,
	Span: 1500 * time.Millisecond, Hold: 5 * time.Second, Misses: 3, LagLimit: 50 * time.Millisecond,
}

func view(n int) []Member {
	var out []Member
	for i := 1; i < n; i++ {
		out = append(out, Member{Name: fmt.Sprintf("m%02d", i), Incarnation: 1})
	}
	return out
}

// rounds runs a round every Interval from t0 until d has passed: answer
// says whether a member answers. It returns how many pings each member got
// and the largest round.
func rounds(c *Check, members []Member, t0 time.Time, d time.Duration, answer func(string) bool) (map[string]int, int) {
	got := map[string]int{}
	most := 0
	for at := time.Duration(0); at <= d; at += c.cfg.Interval {
		now := t0.Add(at)
		c.Lagged(now, 0)
		due := c.Due(now, true, members)
		most = max(most, len(due))
		res := map[string]bool{}
		for _, m := range due {
			got[m.Name]++
			res[m.Name] = answer(m.Name)
		}
		if len(due) > 0 {
			c.Done(now, now.Add(c.cfg.Timeout), res, members)
		}
	}
	return got, most
}

func TestSampleSize(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{1, 0}, {2, 1}, {5, 4}, {16, 4}, {17, 5}, {50, 6}, {100, 7}, {10_000, 14},
	} {
		if got := SampleSize(c.n); got != c.want {
			t.Errorf("SampleSize(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// A round pings SampleSize members, not the whole view, and the least
// recently pinged first: every member of a 50-member view is pinged once
// every ceil(49/6) = 9 rounds.
func TestRoundsAreBoundedAndCoverTheView(t *testing.T) {
	c := New(local, rand.New(rand.NewPCG(1, 2)))
	members := view(50)
	t0 := time.Unix(1000, 0)
	got, most := rounds(c, members, t0, 8*local.Interval, func(string) bool { return true })
	if most != 6 {
		t.Fatalf("a round pinged %d members of 50, want 6", most)
	}
	if len(got) != 49 {
		t.Fatalf("9 rounds pinged %d distinct members, want all 49", len(got))
	}
	for name, k := range got {
		if k > 2 {
			t.Fatalf("%s pinged %d times in 9 rounds while others waited", name, k)
		}
	}
	if c.Pings() != 9*6 {
		t.Fatalf("Pings = %d, want 54", c.Pings())
	}
	// Not troubled: no round.
	if due := c.Due(t0.Add(time.Hour), false, members); due != nil {
		t.Fatalf("a round while not troubled: %v", due)
	}
}

// A node cut off from everyone counts every member unreachable after Span
// (though each member was pinged only once or twice, never three times),
// and none before; a node that reaches a majority counts nobody.
func TestIsolatedNodeAtScale(t *testing.T) {
	members := view(50)
	t0 := time.Unix(1000, 0)
	c := New(local, rand.New(rand.NewPCG(1, 2)))
	rounds(c, members, t0, local.Span-local.Interval, func(string) bool { return false })
	if un := c.Unreachable(t0.Add(local.Span-local.Interval), true, members); len(un) != 0 {
		t.Fatalf("before Span: %d unreachable", len(un))
	}
	rounds(c, members, t0.Add(local.Span), 0, func(string) bool { return false })
	if un := c.Unreachable(t0.Add(local.Span), true, members); len(un) != 49 {
		t.Fatalf("cut off for Span: %d of 49 unreachable", len(un))
	}
	if un := c.Unreachable(t0.Add(local.Span), false, members); len(un) != 0 {
		t.Fatalf("not troubled: %d unreachable", len(un))
	}
	// Past Span+Hold from each member's first miss (all were pinged
	// within the first 9 rounds), nobody counts.
	later := t0.Add(9*local.Interval + local.Span + local.Hold)
	rounds(c, members, t0.Add(local.Span+local.Interval), later.Sub(t0)-local.Span-local.Interval, func(string) bool { return false })
	if un := c.Unreachable(later, true, members); len(un) != 0 {
		t.Fatalf("after Span+Hold: %d still unreachable", len(un))
	}

	// 30 of 49 answer: a majority; nobody counts (no member misses three
	// pings in a row within Span at this sample size).
	c = New(local, rand.New(rand.NewPCG(1, 2)))
	rounds(c, members, t0, local.Span, func(name string) bool { return name > "m19" })
	if un := c.Unreachable(t0.Add(local.Span), true, members); len(un) != 0 {
		t.Fatalf("reaching 30 of 49: %d unreachable", len(un))
	}
	// 15 of 49 answer: a minority; the others count.
	c = New(local, rand.New(rand.NewPCG(1, 2)))
	rounds(c, members, t0, local.Span, func(name string) bool { return name > "m34" })
	un := c.Unreachable(t0.Add(local.Span), true, members)
	if len(un) != 34 || slices.ContainsFunc(un, func(n string) bool { return n > "m34" }) {
		t.Fatalf("reaching 15 of 49: unreachable %v", un)
	}
}

// A late node pings nobody, a round it was late for doesn't count, and a
// node late for a whole Span has no verdict, however its pings fared.
func TestLateNodeNeitherPingsNorBlames(t *testing.T) {
	members := view(5)
	t0 := time.Unix(1000, 0)
	c := New(local, rand.New(rand.NewPCG(1, 2)))
	c.Lagged(t0, 120*time.Millisecond)
	if !c.LateThisInterval(t0) || c.Lag(t0) != 120*time.Millisecond {
		t.Fatalf("after a lag of 120ms: late %v, lag %v", c.LateThisInterval(t0), c.Lag(t0))
	}
	if due := c.Due(t0, true, members); due != nil {
		t.Fatalf("a late node pinged %v", due)
	}
	if c.LateThisInterval(t0.Add(local.Interval)) {
		t.Fatal("still late an Interval after the last lag")
	}
	// A round with a lag spike in it, and one read too late: neither counts.
	start := t0.Add(local.Interval)
	miss := map[string]bool{}
	for _, m := range c.Due(start, true, members) {
		miss[m.Name] = false
	}
	c.Lagged(start.Add(20*time.Millisecond), 60*time.Millisecond)
	if c.Done(start, start.Add(local.Timeout), miss, members) {
		t.Fatal("a round the node was late for counted")
	}
	start = start.Add(2 * local.Interval)
	c.Due(start, true, members)
	if c.Done(start, start.Add(local.Timeout+local.LagLimit+time.Millisecond), miss, members) {
		t.Fatal("a round whose answers were read late counted")
	}
	// Late every tick for long: whatever the pings say, nobody counts.
	for at := time.Duration(0); at < 3*local.Span; at += 20 * time.Millisecond {
		now := start.Add(local.Interval + at)
		c.Lagged(now, 100*time.Millisecond)
		if due := c.Due(now, true, members); due != nil {
			t.Fatalf("pinged while late: %v", due)
		}
	}
	if un := c.Unreachable(start.Add(3*local.Span), true, members); len(un) != 0 {
		t.Fatalf("a late node counts %v unreachable", un)
	}
	// The storm's policy pings everyone anyway.
	storm := New(Config{Interval: local.Interval, Span: local.Span, LagLimit: local.LagLimit, PingAll: true, IgnoreLag: true}, rand.New(rand.NewPCG(1, 2)))
	storm.Lagged(t0, time.Second)
	if due := storm.Due(t0, true, view(50)); len(due) != 49 {
		t.Fatalf("PingAll pinged %d of 49", len(due))
	}
}

// A tick's lag: how long after it fired the loop ran it, or how far the
// gap since the previous tick exceeds the interval.
func TestTickLag(t *testing.T) {
	t0 := time.Unix(1000, 0)
	every := 20 * time.Millisecond
	for _, c := range []struct {
		prev, fired, now time.Time
		want             time.Duration
	}{
		{time.Time{}, t0, t0, 0},
		{t0, t0.Add(every), t0.Add(every), 0},
		{t0, t0.Add(every), t0.Add(every + 5*time.Millisecond), 5 * time.Millisecond},
		{t0, t0.Add(every), t0.Add(5 * every), 4 * every}, // ticks dropped
		{t0, t0.Add(4 * every), t0.Add(5 * every), 4 * every},
	} {
		if got := TickLag(c.prev, c.fired, c.now, every); got != c.want {
			t.Errorf("TickLag(%v, %v, %v) = %v, want %v", c.prev.Sub(t0), c.fired.Sub(t0), c.now.Sub(t0), got, c.want)
		}
	}
}

// An isolated node's rounds are all misses, and a miss takes the whole
// Timeout: a loop on time at every tick but whose ping answers are read
// more than LagLimit after Timeout (the ping goroutines ran late) gets no
// round counted, so it has no verdict and keeps its quorum. It must then
// say it is late (Status.Late, tenure_late), not report itself on time
// while it can't keep the step-down promise.
func TestLateReadsMakeTheNodeLate(t *testing.T) {
	members := view(5)
	t0 := time.Unix(1000, 0)
	c := New(local, rand.New(rand.NewPCG(1, 2)))
	slow := local.Timeout + local.LagLimit + 10*time.Millisecond
	var now time.Time
	for at := time.Duration(0); at <= 3*local.Span; at += 20 * time.Millisecond {
		now = t0.Add(at)
		c.Lagged(now, 0) // every tick on time
		due := c.Due(now, true, members)
		if len(due) == 0 {
			continue
		}
		miss := map[string]bool{}
		for _, m := range due {
			miss[m.Name] = false
		}
		read := now.Add(slow)
		if c.Done(now, read, miss, members) {
			t.Fatal("a round read late counted")
		}
		if c.Lag(read) < slow-local.Timeout {
			t.Fatalf("a round's answers read %v after its start (Timeout %v): lag %v, want at least %v (above LagLimit: Status.Late)",
				slow, local.Timeout, c.Lag(read), slow-local.Timeout)
		}
	}
	if un := c.Unreachable(now, true, members); len(un) != 0 {
		t.Fatalf("no round counted, yet %v unreachable", un)
	}
	// Its negative control: answers read within Timeout+LagLimit count, and
	// leave the node on time.
	c = New(local, rand.New(rand.NewPCG(1, 2)))
	due := c.Due(t0, true, members)
	read := t0.Add(local.Timeout + local.LagLimit)
	if !c.Done(t0, read, map[string]bool{due[0].Name: false}, members) || c.Lag(read) > local.LagLimit {
		t.Fatal("a round read in time was discounted or made the node late")
	}
}

// Issue 11, defect 4, under load: a node restarted on the minority side
// joined a seed whose member list still showed a member cut off by the
// split (the seed's own check counted it unreachable, its failure detector
// had not given up yet). The joiner took that list, had no trouble and no
// evidence of its own, and counted the cut-off member for its quorum.
// While it starts (Start to Start+Hold), a member of the list it joined
// with counts only once this node has had word from it directly: until it
// answers, it is Unvouched, and an untroubled node pings the unvouched
// ones (only those, SampleSize at most a round) without blaming any.
func TestHearsayIsUnvouchedWhileStarting(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cfg := local
	cfg.Start = t0
	c := New(cfg, rand.New(rand.NewPCG(1, 2)))
	// The joiner's view: its seed m3 and m0, which only m3's list shows.
	members := []Member{{Name: "m0", Incarnation: 1}, {Name: "m3", Incarnation: 1}}
	c.Joined(t0, members)
	if got := c.Unvouched(t0, members); !slices.Equal(got, []string{"m0", "m3"}) {
		t.Fatalf("a new node's view: unvouched %v, want both", got)
	}
	c.Vouch(t0, Member{Name: "m3", Incarnation: 1}) // memberlist's probe of m3 answered
	for at := time.Duration(0); at <= 2*local.Span; at += local.Interval {
		now := t0.Add(at)
		c.Lagged(now, 0)
		due := c.Due(now, false, members)
		if len(due) != 1 || due[0].Name != "m0" {
			t.Fatalf("untroubled round at %v pings %v, want only m0 (the unvouched member)", at, due)
		}
		c.Done(now, now.Add(local.Timeout), map[string]bool{"m0": false}, members)
		if got := c.Unvouched(now, members); !slices.Equal(got, []string{"m0"}) {
			t.Fatalf("at %v: unvouched %v, want m0: no answer, no word", at, got)
		}
		if got := c.Unreachable(now, false, members); got != nil {
			t.Fatalf("at %v, untroubled: unreachable %v, want none (vouching rounds blame nobody)", at, got)
		}
	}
	// Trouble begins: the vouching rounds' misses are no evidence.
	if got := c.Unreachable(t0.Add(2*local.Span), true, members); got != nil {
		t.Fatalf("troubled after vouching rounds m0 missed: unreachable %v, want none yet", got)
	}
	// A member that shows up after the join, or a new life of one of the
	// list, came to the cluster itself: not hearsay. Out of the view for
	// a moment and back, in the same life, m0 is still hearsay.
	now := t0.Add(3 * local.Span)
	grown := append(slices.Clone(members), Member{Name: "m5", Incarnation: 1})
	if got := c.Unvouched(now, grown); !slices.Equal(got, []string{"m0"}) {
		t.Fatalf("m5 joined after this node: unvouched %v, want only m0", got)
	}
	if got := c.Unvouched(now, members[1:]); got != nil {
		t.Fatalf("m0 out of the view: unvouched %v, want none", got)
	}
	if got := c.Unvouched(now, []Member{{Name: "m0", Incarnation: 2}, members[1]}); got != nil {
		t.Fatalf("m0 restarted: unvouched %v, want none", got)
	}
	if got := c.Unvouched(now, members); !slices.Equal(got, []string{"m0"}) {
		t.Fatalf("m0 back in the same life: unvouched %v, want m0", got)
	}
	// Hearsay counts once the start window ends (memberlist would have
	// dropped a member really gone): one that answers only by other paths
	// isn't shut out, and the check keeps nothing of it after.
	if got := c.Unvouched(t0.Add(local.Hold-time.Millisecond), members); !slices.Equal(got, []string{"m0"}) {
		t.Fatalf("just before Start+Hold: unvouched %v, want m0", got)
	}
	if got := c.Unvouched(t0.Add(local.Hold), members); got != nil {
		t.Fatalf("at Start+Hold: unvouched %v, want none", got)
	}
	if len(c.hearsay) != 0 {
		t.Fatalf("after the start window the check keeps hearsay of %v", c.hearsay)
	}
	later := t0.Add(local.Hold + local.Interval)
	if due := c.Due(later, false, members); due != nil {
		t.Fatalf("after the start window, untroubled: pings %v, want none", due)
	}
}

// A life first seen after the join is hearsay too unless it is a fresh
// process: a seed that already suspected a cut-off member left it out of
// the list the join took, and a push/pull with another node on the same
// side brings it in later, as alive. A fresh process, a life vouched for,
// and anything a founding node sees are not hearsay.
func TestLaterLivesAreHearsayUnlessFresh(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cfg := local
	cfg.Start = t0
	c := New(cfg, rand.New(rand.NewPCG(1, 2)))
	seed, cut, fresh := Member{Name: "m3", Incarnation: 1}, Member{Name: "m0", Incarnation: 1}, Member{Name: "m5", Incarnation: 1}
	c.Joined(t0, []Member{seed})
	c.Vouch(t0, seed)
	now := t0.Add(local.Interval)
	c.Heard(now, seed, false) // seen at the join: not again
	c.Heard(now, cut, false)  // shows a stable membership: it was a member before
	c.Heard(now, fresh, true) // a new process
	members := []Member{cut, seed, fresh}
	if got := c.Unvouched(now, members); !slices.Equal(got, []string{"m0"}) {
		t.Fatalf("unvouched %v, want only m0 (seen after the join, not fresh)", got)
	}
	c.Vouch(now, cut)
	c.Heard(now.Add(local.Interval), cut, false) // seen again, same life: stays vouched
	if got := c.Unvouched(now.Add(local.Interval), members); got != nil {
		t.Fatalf("after m0 answered: unvouched %v, want none", got)
	}
	founder := New(cfg, rand.New(rand.NewPCG(1, 2)))
	founder.Heard(now, cut, false)
	if got := founder.Unvouched(now, members); got != nil {
		t.Fatalf("a founding node: unvouched %v, want none", got)
	}
	c.Heard(t0.Add(local.Hold), Member{Name: "m7", Incarnation: 1}, false)
	if got := c.Unvouched(t0.Add(local.Hold), append(members, Member{Name: "m7", Incarnation: 1})); got != nil {
		t.Fatalf("after the start window: unvouched %v, want none", got)
	}
}

// Without a Start there is no start window, and a founding node (nothing
// Joined) has nothing to vouch for: nothing is hearsay, and an untroubled
// node pings nobody.
func TestNoHearsayWithoutAStartOrAJoin(t *testing.T) {
	t0 := time.Unix(1000, 0)
	members := view(5)
	c := New(local, rand.New(rand.NewPCG(1, 2)))
	c.Joined(t0, members)
	if got := c.Unvouched(t0, members); got != nil {
		t.Fatalf("no Start: unvouched %v, want none", got)
	}
	if due := c.Due(t0, false, members); due != nil {
		t.Fatalf("no Start, untroubled: pings %v, want none", due)
	}
	cfg := local
	cfg.Start = t0
	founder := New(cfg, rand.New(rand.NewPCG(1, 2)))
	founder.Joined(t0, nil)
	if got := founder.Unvouched(t0.Add(local.Interval), members); got != nil {
		t.Fatalf("a founder, members joined it: unvouched %v, want none", got)
	}
	if due := founder.Due(t0.Add(local.Interval), false, members); due != nil {
		t.Fatalf("a founder, untroubled: pings %v, want none", due)
	}
}

// Vouching pings are SampleSize a round: a node that joins a 50-member view
// has word from all of them after about (n-1)/SampleSize(n) rounds, and
// pings nobody after that.
func TestVouchingIsBounded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cfg := local
	cfg.Start = t0
	c := New(cfg, rand.New(rand.NewPCG(3, 4)))
	members := view(50)
	c.Joined(t0, members)
	rounds := 0
	for at := time.Duration(0); len(c.Unvouched(t0.Add(at), members)) > 0; at += local.Interval {
		now := t0.Add(at)
		due := c.Due(now, false, members)
		if len(due) > SampleSize(50) {
			t.Fatalf("round %d pings %d, want at most %d", rounds, len(due), SampleSize(50))
		}
		res := map[string]bool{}
		for _, m := range due {
			res[m.Name] = true
		}
		c.Done(now, now.Add(local.Timeout), res, members)
		if rounds++; rounds > 9 {
			t.Fatalf("after %d rounds still unvouched: %v", rounds, c.Unvouched(now, members))
		}
	}
	if due := c.Due(t0.Add(local.Hold/2), false, members); due != nil {
		t.Fatalf("all vouched: pings %v", due)
	}
}
