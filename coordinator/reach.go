package coordinator

import (
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/internal/reach"
	"github.com/tenure-go/tenure/ownership"
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
// loop pings a few members of its view directly, once per ProbeInterval:
// internal/reach decides whom, and whom the answers make Unreachable in
// the view the machine counts quorum against (a member that missed
// reachMisses pings in a row over reachSpan, or every member that didn't
// answer within reachSpan once the answers say this node reaches fewer
// than half its view), for reachHold at most; one answer clears a member.
// A round pings reach.SampleSize(n) members, O(log n): the first version
// pinged every member at once, and at 50 nodes in one process on 2 cores
// that fed on its own load (every node troubled, every node pinging 49,
// the pings late, members marked unreachable, quorum lost, partitions
// moving; the cluster never converged).
//
// Apart from hearsay while a node starts (below), the check decides
// nothing once the health score is back to zero (memberlist's probes, indirect and over TCP, got through again, and its
// member list is the truth), nor after reachHold: by then memberlist has
// dropped a member that is really gone, and one it still lists answers its
// probes by other paths. That is what keeps a node with partial
// connectivity (it reaches some members only through others) or with a
// member that gets no UDP counting them, and a slow node from giving its
// leases up for a moment's delay.
//
// And it knows its own lateness: every tick measures how late the loop
// ran it (its lag), and every round how late after ProbeTimeout it read
// the answers (a miss takes the whole ProbeTimeout, so an isolated node's
// rounds are the ones read late; such a round doesn't count). A node
// whose lag exceeds lagLimit is Late (Status says so); while its loop
// lags it starts no round, and a round it was late for doesn't count,
// because a ping it couldn't wait for is evidence against itself. A Late node that is also cut off has no verdict and keeps
// memberlist's: it can't promise to end its leases before the majority's
// Grace (the fence still stops its writes).
//
// And, while it starts, it keeps hearsay out of the quorum (issue 11,
// defect 4, under load): a node that joins takes its seed's member list
// whole, and a seed on the minority side of a split still lists members
// its failure detector has not given up on (its own check counts them
// unreachable; the joiner, with no trouble and no evidence, counted them
// and claimed). So for reachHold after this node's loop starts, a member
// of the list its join took (joinedWith, reach.Joined) counts only
// once this node has had word from it directly: memberlist's probe of it
// answered (NotifyPingComplete, collected in acks and vouched for at the
// next tick) or a ping of the check's did; until then the view marks it
// Unreachable (reach.Unvouched; the no-quorum log names it as unheard).
// While a member is unvouched, an untroubled node pings the unvouched
// ones, reach.SampleSize a round, and blames none. Members that show up
// later came to the cluster themselves and count at once, and after the
// window an established node never holds back for hearsay: the first
// version applied the rule to every new life a node saw, and cost
// survivors their quorum whenever members restarted.

// reachMisses is the fewest pings in a row a member must miss to be
// counted unreachable, and the fewest rounds a node-wide verdict needs: a
// lost packet is not a partition.
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

// lagLimit is the loop lag above which a node is late: half a
// ProbeTimeout. A node that late can't wait for a ping's answer properly,
// so its reach check stops (it can't promise to end its leases before the
// majority's Grace if it is cut off), and it ends its leases that much
// after StepDown.
func lagLimit(c Config) time.Duration { return c.Memberlist.ProbeTimeout / 2 }

// reachConfig is the policy's timing for c, on a node that started at
// start (hearsay counts for no quorum until start+reachHold).
func reachConfig(c Config, start time.Time) reach.Config {
	return reach.Config{
		Interval: c.Memberlist.ProbeInterval, Timeout: c.Memberlist.ProbeTimeout,
		Span: reachSpan(c), Hold: reachHold(c), Misses: reachMisses, LagLimit: lagLimit(c),
		Start: start,
	}
}

// joinedWith returns the members known now but this node: right after
// the join, the member lists the seeds gave it (and any member that joined
// this node meanwhile, which a ping then vouches for at once).
func (c *Coordinator) joinedWith() []reach.Member {
	var out []reach.Member
	for _, e := range c.nodes.live() {
		if e.err == nil && e.member.Name != c.cfg.Name {
			out = append(out, reach.Member{Name: e.member.Name, Incarnation: e.member.Incarnation})
		}
	}
	return out
}

// reachResult is one check's answers: member name to whether it acked.
type reachResult map[string]bool

// ticked records how late the loop ran the tick that fired at fired.
func (l *loop) ticked(fired time.Time) {
	c := l.c
	now := c.cfg.Clock.Now()
	l.reach.Lagged(now, reach.TickLag(l.tickAt, fired, now, c.cfg.TickInterval))
	l.tickAt = now
	lag := l.reach.Lag(now)
	c.lag.Store(int64(lag))
	c.metrics.lag.Set(lag.Seconds())
	late := 0.0
	if lag > lagLimit(c.cfg) {
		late = 1
	}
	c.metrics.late.Set(late)
}

// reachMembers returns members but this node, for the check.
func (l *loop) reachMembers(members map[string]ownership.Member) []reach.Member {
	out := make([]reach.Member, 0, len(members))
	for name, m := range members {
		if name != l.c.cfg.Name {
			out = append(out, reach.Member{Name: name, Incarnation: m.Incarnation})
		}
	}
	slices.SortFunc(out, func(a, b reach.Member) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// maybeReach runs on every tick: it vouches for the members memberlist's
// probes heard from, starts a reach check when one is due, and gives the
// machine a new view when the trouble is over, a verdict ran out, or a
// member is vouched for. With no trouble nobody is unreachable, but the
// runs of misses stay: a member that answers no ping across the gaps
// between troubles (one that memberlist reaches only by other paths) is
// not counted out again for each new trouble, only once, for reachHold.
func (l *loop) maybeReach() {
	c := l.c
	if c.cfg.MinQuorum == 1 || c.ml == nil {
		return
	}
	v := c.view.Load()
	if v == nil {
		return
	}
	now := c.cfg.Clock.Now()
	if !l.reach.Starting(now) {
		c.acks.stop() // no hearsay left to vouch for
	}
	acked := c.acks.drain()
	troubled := l.troubled()
	if !troubled && len(acked) == 0 && len(l.unreach) == 0 && len(l.unheard) == 0 {
		return // nothing to check, vouch for or clear
	}
	members := l.reachMembers(v.members)
	for _, name := range acked {
		if i := slices.IndexFunc(members, func(m reach.Member) bool { return m.Name == name }); i >= 0 {
			l.reach.Vouch(now, members[i])
		}
	}
	if l.verdictsChanged(members) {
		l.refreshMembers()
		v = c.view.Load()
		members = l.reachMembers(v.members)
	}
	targets := l.reach.Due(now, troubled, members)
	if len(targets) == 0 {
		return
	}
	c.metrics.reachChecks.Inc()
	c.metrics.reachPings.Add(float64(len(targets)))
	addrs := make(map[string]string, len(targets))
	for _, m := range targets {
		addrs[m.Name] = v.members[m.Name].GossipAddr
	}
	ml := c.ml
	l.goWork(func() input {
		// At once: a check takes one ProbeTimeout.
		res := make(reachResult, len(addrs))
		var mu sync.Mutex
		var wg sync.WaitGroup
		for name, addr := range addrs {
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
	c := l.c
	v := c.view.Load()
	if v == nil {
		return
	}
	members := l.reachMembers(v.members)
	if !l.reach.Done(at, c.cfg.Clock.Now(), res, members) {
		c.log.Debug("reach check discounted: this node was late", "lag", l.reach.Lag(c.cfg.Clock.Now()))
	}
	if l.verdictsChanged(members) {
		l.refreshMembers()
	}
}

// verdicts returns the members the check counts out of the quorum now, of
// members (reachMembers), each sorted: unreachable (read with the health
// score: with none, nobody is) and unheard (hearsay while this node
// starts, reach.Unvouched).
func (l *loop) verdicts(members []reach.Member) (unreach, unheard []string) {
	now := l.c.cfg.Clock.Now()
	return l.reach.Unreachable(now, l.troubled(), members), l.reach.Unvouched(now, members)
}

// verdictsChanged reports whether the verdicts differ from those the
// current view was built with.
func (l *loop) verdictsChanged(members []reach.Member) bool {
	unreach, unheard := l.verdicts(members)
	return !slices.Equal(l.unreach, unreach) || !slices.Equal(l.unheard, unheard)
}

// acks collects the members whose answer to a probe of memberlist's came
// (memberlist.PingDelegate), for the loop to vouch for at its next tick.
type acks struct {
	mu      sync.Mutex
	names   []string
	stopped bool // the start window is over: nothing to vouch for
}

// AckPayload implements memberlist.PingDelegate: nothing.
func (a *acks) AckPayload() []byte { return nil }

// NotifyPingComplete implements memberlist.PingDelegate.
func (a *acks) NotifyPingComplete(n *memberlist.Node, _ time.Duration, _ []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.stopped && !slices.Contains(a.names, n.Name) {
		a.names = append(a.names, n.Name)
	}
}

// stop ends the collection: later acks are not kept.
func (a *acks) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped, a.names = true, nil
}

func (a *acks) drain() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.names
	a.names = nil
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
