package coordinator

import (
	"slices"
	"sync"
	"time"
)

// The reach check. A node cut off from the rest of the cluster keeps the
// others in its member list until its own failure detector gives up on
// them, and memberlist's Lifeguard makes that slow on purpose: every probe
// that fails raises the node's health score, and a higher score stretches
// its probe and suspicion timeouts. The others, healthy, drop it sooner.
// Counted against the member list alone, the isolated node would keep its
// quorum, and its leases, after the majority has claimed its partitions
// (measured with Lifeguard's multipliers raised: leases ended 5.4 s after
// the cut, the majority's first fence came at 3.6 s).
//
// So while memberlist reports trouble (a health score above zero), the
// loop pings every member of its view directly, all at once, once per
// ProbeInterval. A member that missed every check for reachSpan (and at
// least reachMisses of them) is Unreachable in the view the machine counts
// quorum against, for reachHold at most; one answer clears it. The check
// decides nothing once the health score is back to zero (memberlist's
// probes, indirect and over TCP, got through again, and its member list is
// the truth), nor after reachHold: by then memberlist has dropped a member
// that is really gone, and one it still lists answers its probes by other
// paths. That is what keeps a node with partial connectivity (it reaches
// some members only through others) or with a member that gets no UDP
// counting them, and a slow node from giving its leases up for a moment's
// delay.

// reachMisses is the fewest checks in a row a member must miss to be
// counted unreachable: a lost packet is not a partition.
const reachMisses = 3

// reachSpan is how long a member must have missed every check: three
// quarters of the time between StepDown and Grace (but at least three
// probe intervals), so that a node cut off from the rest ends its leases
// before the majority's Grace runs out, and a node stalled by load for a
// second does not.
func reachSpan(c Config) time.Duration {
	return max(3*c.Memberlist.ProbeInterval, (c.Grace-c.StepDown)*3/4)
}

// reachHold bounds how long a member counts as unreachable while
// memberlist still lists it: twice Grace.
func reachHold(c Config) time.Duration { return 2 * c.Grace }

// reachState is a member's run of missed checks.
type reachState struct {
	incarnation uint64    // the life that missed them
	misses      int       // checks missed in a row
	since       time.Time // when the first of them started
}

// reachResult is one check's answers: member name to whether it acked.
type reachResult map[string]bool

// maybeReach runs on every tick: it starts a reach check when one is due,
// and gives the machine a new view when the trouble is over.
func (l *loop) maybeReach() {
	c := l.c
	if c.cfg.MinQuorum == 1 || c.ml == nil {
		return
	}
	if !l.troubled() {
		// Nobody is unreachable now. The runs of misses stay: a member
		// that answers no ping across the gaps between troubles (one
		// that memberlist reaches only by other paths) is not counted
		// out again for each new trouble, only once, for reachHold.
		if len(l.unreach) > 0 {
			l.refreshMembers()
		}
		return
	}
	now := c.cfg.Clock.Now()
	if l.reaching || now.Sub(l.reachAt) < c.cfg.Memberlist.ProbeInterval {
		return
	}
	v := c.view.Load()
	if v == nil {
		return
	}
	targets := make(map[string]string, len(v.members))
	for name, m := range v.members {
		if name != c.cfg.Name {
			targets[name] = m.GossipAddr
		}
	}
	if len(targets) == 0 {
		return
	}
	l.reaching, l.reachAt = true, now
	c.metrics.reachChecks.Inc()
	ml := c.ml
	l.goWork(func() input {
		// All at once: a check takes one ProbeTimeout whatever the
		// cluster's size.
		res := make(reachResult, len(targets))
		var mu sync.Mutex
		var wg sync.WaitGroup
		for name, addr := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := ml.Ping(name, gossipAddr(addr))
				mu.Lock()
				res[name] = err == nil
				mu.Unlock()
			}()
		}
		wg.Wait()
		return input{kind: inReached, reach: res, at: now}
	})
}

// reached records a check's answers, started at at, and gives the machine
// a new view if the unreachable members changed.
func (l *loop) reached(res reachResult, at time.Time) {
	l.reaching = false
	v := l.c.view.Load()
	if v == nil || !l.troubled() {
		return
	}
	for name, ok := range res {
		m, live := v.members[name]
		switch {
		case !live:
			// Left the view while the check ran: nothing to reach.
		case ok:
			delete(l.reach, name)
		default:
			st, seen := l.reach[name]
			if !seen || st.incarnation != m.Incarnation {
				st = reachState{incarnation: m.Incarnation, since: at}
			}
			st.misses++
			l.reach[name] = st
		}
	}
	if !slices.Equal(l.unreach, l.unreachable()) {
		l.refreshMembers()
	}
}

// unreachable returns the members that missed every check for reachSpan,
// and not for reachSpan+reachHold, sorted. It reads the health score: with none, nobody is unreachable.
func (l *loop) unreachable() []string {
	c := l.c
	if len(l.reach) == 0 {
		return nil
	}
	now, span, hold := c.cfg.Clock.Now(), reachSpan(c.cfg), reachHold(c.cfg)
	troubled := l.troubled()
	var out []string
	for name, st := range l.reach {
		if d := now.Sub(st.since); st.misses >= reachMisses && d >= span && troubled && d < span+hold {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// troubled reports whether memberlist's health score is above zero: its
// own probes are failing. Only then do missed pings count.
func (l *loop) troubled() bool {
	if l.health != nil {
		return l.health() > 0
	}
	return l.c.ml != nil && l.c.ml.GetHealthScore() > 0
}

// gossipAddr is a member's gossip address as memberlist's Ping takes it.
type gossipAddr string

func (a gossipAddr) Network() string { return "udp" }
func (a gossipAddr) String() string  { return string(a) }
