package sim

import (
	"fmt"
	"strings"

	"github.com/tenure-go/tenure/internal/reach"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// Bounds of the checks that are not safety properties.
const (
	// stormWindow and stormMax: at most stormMax claims of one partition by
	// one node within stormWindow ticks.
	stormWindow = 64
	stormMax    = 16
	// maxPingPong bounds how often in one episode a partition may go back
	// to the node it just left (a move and a move back after a heal is
	// normal; more is two nodes fencing each other in turn, against L5).
	maxPingPong = 2
	// maxViolations keeps a failing run's report short.
	maxViolations = 20
)

// checker holds the invariants and records their violations. It knows the
// truth the nodes don't: the resource's whole history, every token minted,
// who can talk to whom.
type checker struct {
	s          *Sim
	violations []string
	// high is the highest token applied or fenced per partition (S1),
	// kept apart from the resource's own marks.
	high []ownership.Token
	// minted counts every token an authority gave out (S3).
	mints map[ownership.Token]string
	// lastEpoch is the strict authority's last epoch per partition (S4).
	lastEpoch []uint64
	// claims are the recent claim ticks per (node, partition).
	claims map[[2]int][]uint64
	// compSince is when each group of nodes that can all talk to each other
	// formed; splitBrain is set while two lasting groups serve.
	compSince   map[string]uint64
	splitBrain  bool
	SplitBrains int
	twoQuorums  bool
	// lineage holds the stable memberships that descend from the one the
	// founder bootstrapped, each made by a node from one of them. A node
	// that restarts cut off from every other forms a cluster of its own
	// (the all-fresh rule): that one is not of the lineage.
	lineage     map[quorum.StableID]bool
	formed      bool // the cluster first converged
	outdated    []bool
	behindSince []uint64
	compOf      []string // the component each node was last seen in
	noQuorum    []int    // ticks each node has served without a quorum
	// epochs counts tokens minted per partition, for the duel bounds.
	epochs []int
	// holders are the minters of each partition's tokens this episode, and
	// pingPong counts their returns (see maxPingPong).
	holders  [][]serveRec
	pingPong []int
	// crashMinter: crash the next node that mints a token (a fault).
	crashMinter bool
}

func newChecker(s *Sim) *checker {
	return &checker{
		s:           s,
		high:        make([]ownership.Token, s.cfg.Partitions),
		mints:       make(map[ownership.Token]string),
		lastEpoch:   make([]uint64, s.cfg.Partitions),
		claims:      make(map[[2]int][]uint64),
		compSince:   make(map[string]uint64),
		lineage:     make(map[quorum.StableID]bool),
		outdated:    make([]bool, s.cfg.Nodes),
		behindSince: make([]uint64, s.cfg.Nodes),
		compOf:      make([]string, s.cfg.Nodes),
		noQuorum:    make([]int, s.cfg.Nodes),
		epochs:      make([]int, s.cfg.Partitions),
		holders:     make([][]serveRec, s.cfg.Partitions),
		pingPong:    make([]int, s.cfg.Partitions),
	}
}

// adopted records that n replaced its stable membership with s. The
// lineage starts with the founder's bootstrap; a node stays of it through
// every change it makes or hears. A node that knew none joins it by
// hearing one of it, except a version 1 heard after the cluster formed:
// that is a new cluster, formed by nodes that restarted cut off from
// the rest, whatever its members' names.
func (c *checker) adopted(n *node, s quorum.Stable) {
	if !n.stable.Known() {
		n.rooted = n.founder || c.lineage[s.ID()] && (s.Version > 1 || !c.formed)
	}
	if n.rooted {
		c.lineage[s.ID()] = true
	}
}

func (c *checker) fail(format string, args ...any) {
	if len(c.violations) < maxViolations {
		c.violations = append(c.violations, fmt.Sprintf("t=%d ", c.s.now)+fmt.Sprintf(format, args...))
	}
}

// applied checks S1: a write lands only under a token not below anything
// the resource applied or fenced.
func (c *checker) applied(t ownership.Token) {
	p := t.Partition
	if t.Compare(c.high[p]) < 0 {
		c.fail("S1: write under %v applied after %v", t, c.high[p])
	}
	if t.Compare(c.high[p]) > 0 {
		c.high[p] = key(t)
	}
}

// fenced records a fence.
func (c *checker) fenced(t ownership.Token) {
	if t.Compare(c.high[t.Partition]) > 0 {
		c.high[t.Partition] = key(t)
	}
}

// reset: the resource lost its history; S1 starts over.
func (c *checker) reset() {
	for p := range c.high {
		c.high[p] = ownership.Token{}
		c.lastEpoch[p] = 0
	}
}

// minted checks S3: no token is given out twice.
func (c *checker) minted(n *node, t ownership.Token) {
	k := key(t)
	if by, ok := c.mints[k]; ok {
		c.fail("S3: %v minted twice (%s, then %s)", t, by, n.name)
	}
	c.mints[k] = n.name
	c.epochs[t.Partition]++
	if c.crashMinter {
		// A process dies right after its authority answered: the token
		// may be known nowhere else.
		c.crashMinter = false
		s := c.s
		s.Crash(n.idx)
		s.during(s.between(1, 3), func() { s.Restart(n.idx) })
	}
}

// strictClaim checks S4: the strict authority's epochs increase in the
// order claims succeed, one holder each (S3 sees to that). They are dense
// only while nobody has seen more than the authority holds: after a reset,
// or a forged claim in a cluster without keys, the next claim jumps. It
// checks the model's authority (the claim_ignores_mark control shows it
// can fire); the real SQL and etcd authorities are held to S4 by their
// own packages' tests and the chaos suite.
func (c *checker) strictClaim(t, _ ownership.Token) {
	p := t.Partition
	if t.Epoch <= c.lastEpoch[p] {
		c.fail("S4: p%d epoch %d after %d", p, t.Epoch, c.lastEpoch[p])
	}
	c.lastEpoch[p] = t.Epoch
}

// serve checks S2: a lease is served only once the resource was fenced
// with it.
func (c *checker) serve(n *node, t ownership.Token) {
	s := c.s
	if !s.res.fencedWith[key(t)] {
		c.fail("S2: %s serves %v, never fenced (mark %v)", n.name, t, s.res.mark(t.Partition))
	}
	// Ping-pong: the partition is served again by the node it just left,
	// again and again (A, B, A, B, ...): two nodes fence each other in turn.
	// Only within one topology (no fault or heal in between): a split that
	// reshapes may move a partition back legitimately.
	// A return counts when it comes sooner than StableAfter after the
	// partition left: a node fenced out by a rival it can't see respects
	// the rival that long (L5 for views that aren't transitive).
	h := append(c.holders[t.Partition], serveRec{fmt.Sprintf("%s@%d", n.name, c.s.faultGen), c.s.now})
	if k := len(h); k >= 3 && h[k-1].who == h[k-3].who && h[k-1].who != h[k-2].who &&
		sameGen(h[k-1].who, h[k-2].who) && sameGen(h[k-2].who, h[k-3].who) &&
		h[k-1].at-h[k-2].at < uint64(c.s.cfg.StableAfter) {
		c.pingPong[t.Partition]++
		if c.pingPong[t.Partition] == maxPingPong+1 {
			c.fail("duel: p%d went back and forth between %s and %s %d times", t.Partition, h[len(h)-1].who, h[len(h)-2].who, c.pingPong[t.Partition])
		}
	}
	c.holders[t.Partition] = h
}

// release checks the handler contract: Release only for a lease whose
// Acquire succeeded, once.
func (c *checker) release(n *node, t ownership.Token) {
	if !n.acquired[key(t)] {
		c.fail("handler: Release of %v on %s without an Acquire, or twice", t, n.name)
	}
	delete(n.acquired, key(t))
}

// claimed checks for claim storms.
func (c *checker) claimed(n *node, p uint32) {
	k := [2]int{n.idx, int(p)}
	now := c.s.now
	ts := append(c.claims[k], now)
	for len(ts) > 0 && now-ts[0] > stormWindow {
		ts = ts[1:]
	}
	c.claims[k] = ts
	if len(ts) > stormMax {
		c.fail("storm: %s claimed p%d %d times in %d ticks", n.name, p, len(ts), stormWindow)
		c.claims[k] = nil
	}
}

// step watches lasting splits. It counts the times two sides of one serve
// at once (SplitBrains: the stable membership allows it while a split that
// formed during a join is undetected; the fence keeps it safe), and fails a
// node that serves while a member it has been able to talk to for a while
// holds a newer stable membership: that node should have learned it and
// counted its quorum against it (the outdated rule, which keeps a node that
// restarts on the minority side of a split from serving).
func (c *checker) step() {
	s := c.s
	now := s.now
	w := uint64(s.cfg.DetectMax + s.cfg.JoinDelay + 2*s.cfg.GossipDelay + s.cfg.StepDown + 3)
	seen := make(map[string]bool)
	quorate := make(map[quorum.StableID]string) // stable ID -> a group counting a quorum of it
	var quorateComps []string
	serving := 0
	for _, comp := range s.net.components() {
		k := s.names(comp)
		seen[k] = true
		var newest quorum.StableID
		for _, i := range comp {
			if id := s.nodes[i].stableID; id.Compare(newest) > 0 {
				newest = id
			}
		}
		// Behind is measured against the node's component, from the tick
		// it joined it, whether the node serves or not: a node that fell
		// behind in one component, or stopped serving and caught up, must
		// not carry the old start into its next lease.
		for _, i := range comp {
			switch {
			case c.compOf[i] != k || s.nodes[i].stableID.Compare(newest) >= 0:
				c.compOf[i], c.behindSince[i] = k, 0
			case c.behindSince[i] == 0:
				c.behindSince[i] = now
			}
		}
		since, ok := c.compSince[k]
		if !ok {
			c.compSince[k] = now
			continue
		}
		if now-since <= w {
			continue
		}
		busy := false
		ids := make(map[quorum.StableID]bool)
		for _, i := range comp {
			n := s.nodes[i]
			if !n.servesAny() {
				continue
			}
			busy = true
			if n.m.Quorum() {
				ids[n.stableID] = true
			}
			if c.behindSince[i] != 0 && now-c.behindSince[i] > w && !c.outdated[i] {
				c.outdated[i] = true
				c.fail("outdated: %s serves counting against %v, %d ticks after %s's members came to hold %v", n.name, n.stable, now-c.behindSince[i], k, newest)
			}
		}
		if busy {
			serving++
			for _, i := range comp {
				if n := s.nodes[i]; n.servesAny() && n.m.Quorum() && n.rooted {
					quorateComps = append(quorateComps, k)
					break
				}
			}
			for id := range ids {
				if other, ok := quorate[id]; ok && !c.twoQuorums {
					c.twoQuorums = true
					c.fail("two quorums: %s and %s both count a quorum of stable membership %v", other, k, id)
				}
				quorate[id] = k
			}
		}
	}
	// L4: a node without a quorum stops serving within StepDown.
	for i, n := range s.nodes {
		if !n.running() || n.m.Quorum() || !n.servesAny() {
			c.noQuorum[i] = 0
			continue
		}
		if c.noQuorum[i]++; c.noQuorum[i] == s.cfg.StepDown+3 {
			c.fail("L4: %s serves without a quorum for %d ticks", n.name, c.noQuorum[i])
		}
	}
	for k := range c.compSince {
		if !seen[k] {
			delete(c.compSince, k)
		}
	}
	// Two groups that count a quorum of two different stable memberships,
	// both of the cluster's lineage: one of them was made without a
	// quorum of the membership it replaced (issue 19, defect 4: a leave
	// during a split shrank both sides' sets).
	if len(quorateComps) > 1 && !c.twoQuorums {
		c.twoQuorums = true
		c.fail("two quorums: %s both serve counting a quorum of stable memberships of one lineage", strings.Join(quorateComps, " and "))
	}
	if serving > 1 && !c.splitBrain {
		c.SplitBrains++
	}
	c.splitBrain = serving > 1
	if serving <= 1 {
		c.twoQuorums = false
	}
}

// serveRec is one lease served: by whom (name@fault generation), when.
type serveRec struct {
	who string
	at  uint64
}

// sameGen reports whether two holder records share a fault generation.
func sameGen(a, b string) bool {
	return a[strings.IndexByte(a, '@'):] == b[strings.IndexByte(b, '@'):]
}

// newEpisode forgets the history the per-episode bounds count.
func (c *checker) newEpisode() {
	for p := range c.holders {
		c.holders[p] = c.holders[p][:0]
		c.pingPong[p] = 0
	}
}

// handlerContract checks, on a quiet cluster, that every lease a handler
// acquired and that has ended was released.
func (c *checker) handlerContract() {
	for _, n := range c.s.nodes {
		if !n.running() {
			continue
		}
		for t := range n.acquired {
			if ph, cur := n.m.Phase(t.Partition); !(ph >= machine.Acquiring && cur.Same(t)) {
				c.fail("handler: %s's lease %v ended without a Release", n.name, t)
			}
		}
	}
}

// pinged checks a round of the reach check (issues 20 and 22, the reach
// storm): at most reach.SampleSize pings in a view of size members, and
// none from a node whose loop lags.
func (c *checker) pinged(n *node, k, size int, late bool) {
	if bound := reach.SampleSize(size); k > bound {
		c.fail("reach storm: %s pinged %d members of a view of %d in one round (bound %d)", n.name, k, size, bound)
	}
	if late {
		c.fail("reach storm: %s pinged %d members while its loop lagged", n.name, k)
	}
}

// marked checks a node's reach check when it counts a member unreachable
// (un: all it counts now): counting only members whose pings could all
// have been answered over the check's span is blaming them for the node's
// own lateness.
func (c *checker) marked(n *node, un []string) {
	s := c.s
	for _, name := range un {
		j := s.nodeByName(name).idx
		if s.now-s.net.unpingable[n.idx][j] <= uint64(s.cfg.ReachSpan+2) {
			return // one of them really was out of reach
		}
	}
	c.fail("self-blame: %s counts %v unreachable, though every ping of them could have been answered for %d ticks", n.name, un, s.cfg.ReachSpan+2)
}
