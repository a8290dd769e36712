package reach

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"time"
)

// Config is the policy's timing.
type Config struct {
	// Interval is the time between rounds (memberlist's ProbeInterval).
	Interval time.Duration
	// Timeout is how long a round's pings wait for answers (ProbeTimeout).
	Timeout time.Duration
	// Span is how long misses must last before they count.
	Span time.Duration
	// Hold bounds how long a member counts as unreachable.
	Hold time.Duration
	// Misses is the fewest pings in a row a member must miss, and the
	// fewest counted rounds the node-wide verdict needs.
	Misses int
	// LagLimit is the loop lag above which the node is late.
	LagLimit time.Duration
	// Start is when this node started. Until Start+Hold, a member of the
	// list it took when it joined (Joined) counts only once this node has
	// had word from it directly (Unvouched); after that, the node's own
	// failure detector has had its say on every member, and the check keeps
	// no word. Zero: no such window.
	Start time.Time
	// PingAll pings every member each round, and IgnoreLag pings and
	// counts rounds whatever the node's own lag: together, the first
	// version's reach storm. For negative controls only.
	PingAll, IgnoreLag bool
}

// SampleSize is how many members a round pings in a view of n members
// (this node included): max(4, ceil(log2 n)), at most n-1.
func SampleSize(n int) int {
	if n <= 1 {
		return 0
	}
	return min(n-1, max(4, bits.Len(uint(n-1))))
}

// Member is a member of the view: its name and the life the check's
// evidence is about (a new incarnation starts afresh).
type Member struct {
	Name        string
	Incarnation uint64
}

// Check is one node's reach check. It is not safe for concurrent use: the
// loop owns it.
type Check struct {
	cfg  Config
	rnd  *rand.Rand
	runs map[string]*run

	lags     []lagSample // within Span
	lateAt   time.Time   // the last lag above LagLimit
	inflight bool
	started  time.Time // the last round's start
	rounds   []round   // counted rounds, within Span and an Interval
	cutSince time.Time // the first round of a node-wide verdict that holds; zero: none
	pings    uint64

	hearsay  map[string]uint64 // within the start window: the lives Joined or Heard listed that this node has had no word from yet
	seen     map[string]uint64 // within the start window: the lives Joined or Heard showed
	vouching bool              // the round in flight only seeks word from unvouched members
}

// run is what one member's pings showed.
type run struct {
	incarnation uint64
	misses      int       // pings missed in a row
	since       time.Time // when the first of them was sent; zero: none
	answered    time.Time // the last answer
	pinged      time.Time // the last ping
}

type lagSample struct {
	at  time.Time
	lag time.Duration
}

type round struct {
	start            time.Time
	pinged, answered int
}

// New returns a check with no evidence. rnd breaks ties between members
// pinged equally long ago.
func New(cfg Config, rnd *rand.Rand) *Check {
	return &Check{cfg: cfg, rnd: rnd, runs: make(map[string]*run), hearsay: make(map[string]uint64), seen: make(map[string]uint64)}
}

// Starting reports whether now is within the start window, Start+Hold.
// Past it, the check forgets the hearsay.
func (c *Check) Starting(now time.Time) bool { return c.starting(now) }

func (c *Check) starting(now time.Time) bool {
	if c.cfg.Start.IsZero() || now.Sub(c.cfg.Start) >= c.cfg.Hold {
		clear(c.hearsay)
		clear(c.seen)
		return false
	}
	return true
}

// Joined records, at now, the members this node knew right after it
// joined (itself left out): the member list it took from its seeds, which
// is their word, not its own. Within the start window, these lives are
// hearsay until they answer (Vouch). Call it once, on a node that joined
// (a founding node has no hearsay).
func (c *Check) Joined(now time.Time, members []Member) {
	if c.starting(now) {
		for _, m := range members {
			c.hearsay[m.Name] = m.Incarnation
			c.seen[m.Name] = m.Incarnation
		}
	}
}

// Heard records, at now, a life this node's view shows, fresh if it is a
// new process (it shows no stable membership yet). Within the start window
// of a node that joined, a life first seen after the join is hearsay too
// unless it is fresh: a seed that already suspected a cut-off member when
// this node joined left it out of the list (memberlist ignores a suspect
// it has never heard of), and a later push/pull with another node on the
// same side brings it in as alive. A fresh process came to the cluster
// itself, and counts at once: holding those back kept a founding node
// from growing the stable membership at once, and a crash in a cluster's
// first seconds then cost it its quorum for good.
func (c *Check) Heard(now time.Time, m Member, fresh bool) {
	if len(c.seen) == 0 || !c.starting(now) {
		return // no join, or the window is over
	}
	if inc, ok := c.seen[m.Name]; ok && inc == m.Incarnation {
		return
	}
	c.seen[m.Name] = m.Incarnation
	if !fresh {
		c.hearsay[m.Name] = m.Incarnation
	}
}

// Vouch records, at now, direct word from member m's life: it answered a
// ping of this node's (memberlist's probe or the check's).
func (c *Check) Vouch(now time.Time, m Member) {
	if c.starting(now) && c.hearsay[m.Name] == m.Incarnation {
		delete(c.hearsay, m.Name)
	}
}

// Unvouched returns the members of the view that are hearsay (see Joined)
// in their current life, sorted, while this node is within Start+Hold (by
// then its own failure detector has dropped a member that is really gone,
// and one it still lists reaches it by other paths): they count for no
// quorum (see the package doc). A new life of a member is its own word,
// not hearsay.
func (c *Check) Unvouched(now time.Time, members []Member) []string {
	var out []string
	for _, m := range c.unvouched(now, members) {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// unvouched returns the members, of members, that count as unvouched at
// now.
func (c *Check) unvouched(now time.Time, members []Member) []Member {
	if !c.starting(now) {
		return nil
	}
	var out []Member
	for _, m := range members {
		if inc, ok := c.hearsay[m.Name]; ok && inc == m.Incarnation {
			out = append(out, m)
		}
	}
	return out
}

// TickLag is how late a tick ran: the larger of how long after it fired
// the loop got to it (now-fired) and by how much the gap since the
// previous tick the loop ran (prev) exceeds the tick interval every (a
// late loop's ticker drops ticks).
func TickLag(prev, fired, now time.Time, every time.Duration) time.Duration {
	lag := max(now.Sub(fired), 0)
	if !prev.IsZero() {
		lag = max(lag, now.Sub(prev)-every)
	}
	return lag
}

// Lagged records the loop's lag at now.
func (c *Check) Lagged(now time.Time, lag time.Duration) {
	c.lags = slices.DeleteFunc(c.lags, func(s lagSample) bool { return now.Sub(s.at) > c.cfg.Span })
	if lag > 0 {
		c.lags = append(c.lags, lagSample{now, lag})
	}
	if lag > c.cfg.LagLimit {
		c.lateAt = now
	}
}

// Lag returns the largest lag recorded within the last Span.
func (c *Check) Lag(now time.Time) time.Duration {
	var out time.Duration
	for _, s := range c.lags {
		if now.Sub(s.at) <= c.cfg.Span {
			out = max(out, s.lag)
		}
	}
	return out
}

// LateThisInterval reports whether the node was late within the last
// Interval: while it is, the check pings nobody. It is not
// coordinator.Status.Late, which says the largest lag over the last Span
// (Lag) is above LagLimit: a node can be late by Status for a Span after
// one late tick, and pinging again after an Interval.
func (c *Check) LateThisInterval(now time.Time) bool {
	return !c.lateAt.IsZero() && now.Sub(c.lateAt) < c.cfg.Interval
}

// Pings returns how many pings the check has asked for.
func (c *Check) Pings() uint64 { return c.pings }

// Due returns the members to ping now, or nil: a round is due every
// Interval while troubled, or while some member is unvouched (then it
// pings only those, and its answers only vouch), one at a time, never
// while late. The caller pings them and calls Done with the answers.
func (c *Check) Due(now time.Time, troubled bool, members []Member) []Member {
	pool := members
	if !troubled {
		pool = c.unvouched(now, members)
	}
	if c.inflight || len(pool) == 0 || !c.started.IsZero() && now.Sub(c.started) < c.cfg.Interval {
		return nil
	}
	if !c.cfg.IgnoreLag && c.LateThisInterval(now) {
		return nil
	}
	k := min(len(pool), SampleSize(len(members)+1))
	if c.cfg.PingAll {
		k = len(pool)
	}
	order := slices.Clone(pool)
	c.rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	slices.SortStableFunc(order, func(a, b Member) int { return c.lastPinged(a).Compare(c.lastPinged(b)) })
	order = order[:k]
	for _, m := range order {
		c.runOf(m).pinged = now
	}
	c.inflight, c.started, c.vouching = true, now, !troubled
	c.pings += uint64(k)
	return order
}

func (c *Check) lastPinged(m Member) time.Time {
	if r, ok := c.runs[m.Name]; ok && r.incarnation == m.Incarnation {
		return r.pinged
	}
	return time.Time{}
}

// runOf returns m's run, a new one for a new life.
func (c *Check) runOf(m Member) *run {
	r, ok := c.runs[m.Name]
	if !ok || r.incarnation != m.Incarnation {
		r = &run{incarnation: m.Incarnation}
		c.runs[m.Name] = r
	}
	return r
}

// Done records the answers (member name to whether it answered) of the
// round that started at start, read at now, and reports whether the round
// counted: one the node was late for is dropped. Answers read after
// Timeout show in Lag (by how much they were late), so a node whose loop
// ran every tick on time but that can't read its answers in time says it
// is late: a miss takes the whole Timeout, so an isolated node's rounds
// are the ones that come in late, and those don't count. (They don't
// hold the next round back: that is for the loop's own lag.)
func (c *Check) Done(start, now time.Time, answers map[string]bool, members []Member) bool {
	c.inflight = false
	c.forget(members)
	for _, m := range members {
		if answers[m.Name] {
			c.Vouch(now, m) // an answer is word from m, however late it was read
		}
	}
	if c.vouching {
		// A round run only to vouch (no trouble): its misses and lateness
		// are no evidence, as no round is while untroubled.
		c.vouching = false
		return true
	}
	if d := now.Sub(start) - c.cfg.Timeout; d > 0 {
		c.lags = append(c.lags, lagSample{now, d})
	}
	if !c.cfg.IgnoreLag && (now.Sub(start) > c.cfg.Timeout+c.cfg.LagLimit || !c.lateAt.Before(start)) {
		return false
	}
	rd := round{start: start}
	for _, m := range members {
		ok, pinged := answers[m.Name]
		if !pinged {
			continue
		}
		r := c.runOf(m)
		rd.pinged++
		if ok {
			rd.answered++
			r.misses, r.since, r.answered = 0, time.Time{}, now
			continue
		}
		if r.misses == 0 {
			r.since = start
		}
		r.misses++
	}
	c.rounds = append(c.rounds, rd)
	return true
}

// forget drops the evidence about members gone from the view or into a
// new life.
func (c *Check) forget(members []Member) {
	for name, r := range c.runs {
		i := slices.IndexFunc(members, func(m Member) bool { return m.Name == name })
		if i < 0 || members[i].Incarnation != r.incarnation {
			delete(c.runs, name)
		}
	}
}

// Unreachable returns the members of the view (this node left out) that
// count as unreachable at now, sorted; none unless troubled. It also ages
// the evidence: call it with non-decreasing times.
func (c *Check) Unreachable(now time.Time, troubled bool, members []Member) []string {
	if !troubled {
		return nil
	}
	span, hold := c.cfg.Span, c.cfg.Hold
	c.rounds = slices.DeleteFunc(c.rounds, func(r round) bool { return now.Sub(r.start) > span+c.cfg.Interval })
	first, cut := c.cutOff(now, len(members)+1)
	switch {
	case !cut:
		c.cutSince = time.Time{}
	case c.cutSince.IsZero():
		c.cutSince = first
	}
	var out []string
	for _, m := range members {
		r, ok := c.runs[m.Name]
		if ok && r.incarnation != m.Incarnation {
			ok = false
		}
		if ok && r.misses >= c.cfg.Misses {
			if d := now.Sub(r.since); d >= span && d < span+hold {
				out = append(out, m.Name)
				continue
			}
		}
		if !cut || ok && now.Sub(r.answered) <= span {
			continue // answered within Span
		}
		since := c.cutSince
		if ok && r.misses > 0 && r.since.Before(since) {
			since = r.since
		}
		if now.Sub(since) < span+hold {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// cutOff reports whether the counted rounds of the last Span (and an
// Interval, for the round in flight) say this node reaches fewer than half
// of a view of n members, and since when the evidence runs (the first of
// those rounds). The rounds must cover Span and be at least Misses.
func (c *Check) cutOff(now time.Time, n int) (time.Time, bool) {
	if len(c.rounds) < c.cfg.Misses || n < 2 {
		return time.Time{}, false
	}
	first := c.rounds[0].start
	if now.Sub(first) < c.cfg.Span {
		return time.Time{}, false
	}
	var pinged, answered int
	for _, r := range c.rounds {
		pinged += r.pinged
		answered += r.answered
	}
	// Estimated reachable peers, answered/pinged of n-1, below n/2.
	return first, pinged > 0 && answered*(n-1) < (n/2)*pinged
}
