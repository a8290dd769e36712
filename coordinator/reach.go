package coordinator

import (
	"slices"
	"sync"
)

// The reach check: a node cut off from the rest of the cluster keeps the
// others in its member list until its own failure detector gives up on
// them, and memberlist's Lifeguard makes that slow on purpose: every probe
// that fails raises the node's health score, and a higher score stretches
// its probe interval, its probe timeout and its suspicion timeout. The
// others, healthy, suspect and drop it sooner. Counted against the member
// list alone, the isolated node would keep its quorum, and its leases,
// after the majority has claimed its partitions (measured with the local
// preset: leases ended 3.45-3.5 s after the cut, partitions fenced by the
// majority at 2.3-2.7 s).
//
// So when memberlist reports trouble (a health score above zero) or a
// check has already found a member silent, the loop pings every member of
// its view directly, at most once per ProbeInterval. A member that misses
// reachMisses checks in a row is Unreachable in the view the machine
// counts quorum against; one answer clears it. An isolated node loses its
// quorum a few probe intervals after the cut, and StepDown later its
// leases, whatever the cluster's size.

// reachMisses is how many checks in a row a member must miss to be
// counted unreachable: a lost packet or a slow scheduler is not a
// partition.
const reachMisses = 3

// reachParallel bounds the pings in flight of one check.
const reachParallel = 32

// reachResult is one check's answers: member name to whether it acked.
type reachResult map[string]bool

// maybeReach starts a reach check when one is due.
func (l *loop) maybeReach() {
	c := l.c
	if l.reaching || c.cfg.MinQuorum == 1 || c.ml == nil {
		return
	}
	now := c.cfg.Clock.Now()
	if now.Sub(l.reachAt) < c.cfg.Memberlist.ProbeInterval {
		return
	}
	if c.ml.GetHealthScore() == 0 && len(l.missed) == 0 {
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
		res := make(reachResult, len(targets))
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, reachParallel)
		for name, addr := range targets {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				_, err := ml.Ping(name, gossipAddr(addr))
				mu.Lock()
				res[name] = err == nil
				mu.Unlock()
			}()
		}
		wg.Wait()
		return input{kind: inReached, reach: res}
	})
}

// reached records a check's answers and reports whether the set of
// unreachable members changed.
func (l *loop) reached(res reachResult) bool {
	l.reaching = false
	before := l.unreachable()
	for name, ok := range res {
		if ok {
			delete(l.missed, name)
		} else {
			l.missed[name]++
		}
	}
	return !slices.Equal(before, l.unreachable())
}

// unreachable returns the members that missed reachMisses checks in a
// row, sorted.
func (l *loop) unreachable() []string {
	var out []string
	for name, n := range l.missed {
		if n >= reachMisses {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// gossipAddr is a member's gossip address as memberlist's Ping takes it.
type gossipAddr string

func (a gossipAddr) Network() string { return "udp" }
func (a gossipAddr) String() string  { return string(a) }
