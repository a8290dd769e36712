package sim

import (
	"slices"

	"github.com/tenure-go/tenure/ownership/gossip"
)

// network models what memberlist gives each node: which members it sees.
// Packets from node i reach node j when link[i][j]. Node i sees j when j
// answers its probes, directly (both directions up) or through a third node
// (memberlist's indirect probes); a change of what is true takes effect in
// i's view after a detection delay drawn per observer, so nodes disagree
// for a while, as they do for real.
type network struct {
	s    *Sim
	link [][]bool
	drop float64
	sees [][]bool
	flip [][]uint64 // tick a pending change of sees[i][j] is due; 0 none
	// left[i] names members i dropped since its last view after hearing
	// their goodbye (the coordinator's View.Left).
	left [][]string
	// leavingHeard[i][j] and goneHeard[i][j]: the incarnation of j whose
	// metadata i last heard say Leaving, and say Gone (the goodbye, sent
	// once the handoff is done); 0 if none. A drop of j counts as a
	// graceful leave only if i heard the goodbye of j's current life
	// (Bugs.GracefulByFlag: if it heard Leaving).
	leavingHeard, goneHeard [][]uint64
	dirty                   []bool // node i's machine needs a new view
	// blind[i][j]: i's failure detector wrongly holds j dead (asymmetric
	// loss that defeats even indirect probes), so views disagree.
	blind [][]bool
	// unreach[i][j]: i's reach check counts j unreachable (see
	// stepReach): j is in i's view but doesn't count for its quorum.
	unreach [][]bool
	// unpingable[i][j]: the last tick a ping from i to j could not have
	// been answered (a cut, a dead or blind j), for the self-blame check.
	unpingable [][]uint64
	// sniffed holds the last messages the network carried, with their
	// channels: what an adversary on the path can copy and replay.
	sniffed []sniffedMsg
}

// sniffedMsg is a message copied off the wire.
type sniffedMsg struct {
	ch  gossip.Channel
	msg []byte
}

// maxSniffed is how many messages the adversary keeps.
const maxSniffed = 16

// sniff records msg, carried on ch, for the adversary.
func (nw *network) sniff(ch gossip.Channel, msg []byte) {
	if len(nw.sniffed) == maxSniffed {
		nw.sniffed = slices.Delete(nw.sniffed, 0, 1)
	}
	nw.sniffed = append(nw.sniffed, sniffedMsg{ch, msg})
}

func newNetwork(s *Sim, n int) *network {
	nw := &network{s: s, left: make([][]string, n), dirty: make([]bool, n)}
	for i := range n {
		nw.link = append(nw.link, make([]bool, n))
		nw.sees = append(nw.sees, make([]bool, n))
		nw.flip = append(nw.flip, make([]uint64, n))
		nw.blind = append(nw.blind, make([]bool, n))
		nw.unreach = append(nw.unreach, make([]bool, n))
		nw.unpingable = append(nw.unpingable, make([]uint64, n))
		nw.leavingHeard = append(nw.leavingHeard, make([]uint64, n))
		nw.goneHeard = append(nw.goneHeard, make([]uint64, n))
		for j := range n {
			nw.link[i][j] = true
		}
	}
	return nw
}

// answers reports whether node j answers probes (a live, running process).
func (nw *network) answers(j int) bool { return nw.s.nodes[j].running() }

func (nw *network) bidi(i, j int) bool { return nw.link[i][j] && nw.link[j][i] }

// reachable is what memberlist would find true: i can probe j directly or
// through another node.
func (nw *network) reachable(i, j int) bool {
	if i == j {
		return true
	}
	if !nw.answers(j) || !nw.answers(i) || nw.blind[i][j] {
		return false
	}
	if nw.bidi(i, j) {
		return true
	}
	for k := range nw.s.nodes {
		if k != i && k != j && nw.answers(k) && nw.bidi(i, k) && nw.bidi(k, j) {
			return true
		}
	}
	return false
}

// step moves every view one tick towards the truth.
func (nw *network) step() {
	s := nw.s
	for i, n := range s.nodes {
		if !n.running() {
			continue
		}
		for j := range s.nodes {
			truth := nw.reachable(i, j)
			if truth == nw.sees[i][j] {
				nw.flip[i][j] = 0
				continue
			}
			if nw.flip[i][j] == 0 {
				d := s.between(s.cfg.DetectMin, s.cfg.DetectMax)
				if truth {
					d = s.between(1, s.cfg.JoinDelay)
				}
				nw.flip[i][j] = s.now + uint64(d)
				continue
			}
			if s.now >= nw.flip[i][j] {
				nw.flip[i][j] = 0
				nw.sees[i][j] = truth
				nw.dirty[i] = true
				if truth && i != j {
					nw.join(i, j)
				}
				if !truth {
					nw.dropped(i, j)
				}
			}
		}
	}
	if s.cfg.ReachSpan > 0 {
		nw.stepReach()
	}
	// Anti-entropy: every PushPull ticks each node exchanges full state
	// with one member it sees, as memberlist's push/pull does.
	if p := uint64(s.cfg.PushPull); p > 0 {
		for i, n := range s.nodes {
			if n.running() && (s.now+uint64(i))%p == 0 {
				var peers []int
				for j := range s.nodes {
					if j != i && nw.sees[i][j] {
						peers = append(peers, j)
					}
				}
				if len(peers) > 0 {
					nw.pushPull(i, peers[s.rng.IntN(len(peers))])
				}
			}
		}
	}
	if s.scale != nil && s.scale.epidemic {
		nw.gossipRounds()
	}
	for i, n := range s.nodes {
		if nw.dirty[i] && n.running() {
			nw.dirty[i] = false
			n.setView()
		}
	}
}

// refreshAll rebuilds every running node's view from the truth at once
// (the cluster's formation).
func (nw *network) refreshAll() {
	for i := range nw.s.nodes {
		for j := range nw.s.nodes {
			nw.sees[i][j] = nw.reachable(i, j)
		}
		nw.dirty[i] = true
	}
}

// view returns the members node i sees, sorted, and the names that left.
func (nw *network) view(i int) (members []int, left []string) {
	for j := range nw.s.nodes {
		if nw.sees[i][j] {
			members = append(members, j)
		}
	}
	left, nw.left[i] = nw.left[i], nil
	return members, left
}

// viewPeek is view without taking the left notices.
func (nw *network) viewPeek(i int) ([]int, []string) {
	var members []int
	for j := range nw.s.nodes {
		if nw.sees[i][j] {
			members = append(members, j)
		}
	}
	return members, nw.left[i]
}

// metaChanged tells the nodes that see n that its metadata changed: they
// rebuild their views once the update has travelled.
func (nw *network) metaChanged(n *node) {
	s := nw.s
	inc, leaving := n.self.Incarnation, n.leaving
	for i := range s.nodes {
		if i != n.idx && nw.sees[i][n.idx] && nw.link[n.idx][i] {
			s.after(s.between(1, s.cfg.GossipDelay), func() {
				if leaving {
					nw.leavingHeard[i][n.idx] = inc
				}
				nw.dirty[i] = true
			})
		}
	}
	nw.dirty[n.idx] = true
}

// departed ends a graceful leave as the coordinator does: the goodbye
// (metadata saying Gone) goes to the members n can reach, then memberlist's
// own leave message, which removes n from the views of those that still
// hear it. A cut between the two loses the second: those members detect n
// gone, and count it graceful because they heard the goodbye. Members that
// missed the goodbye detect n gone, as a crash.
func (nw *network) departed(n *node) {
	s := nw.s
	j, inc := n.idx, n.self.Incarnation
	for i := range s.nodes {
		if i == j || !nw.sees[i][j] || !nw.link[j][i] {
			continue
		}
		s.after(s.between(1, s.cfg.GossipDelay), func() {
			nw.goneHeard[i][j] = inc
			if !nw.link[j][i] {
				return // cut before the leave message
			}
			s.after(s.between(0, s.cfg.GossipDelay), func() {
				if nw.sees[i][j] && !nw.answers(j) {
					nw.sees[i][j] = false
					nw.flip[i][j] = 0
					nw.dirty[i] = true
					nw.dropped(i, j)
				}
			})
		})
	}
}

// dropped records that i's view lost j: a graceful leave if i heard the
// goodbye of j's current life.
func (nw *network) dropped(i, j int) {
	s := nw.s
	inc := s.nodes[j].self.Incarnation
	if nw.goneHeard[i][j] == inc || s.cfg.Bugs.GracefulByFlag && nw.leavingHeard[i][j] == inc {
		nw.left[i] = append(nw.left[i], s.nodes[j].name)
	}
}

// send delivers a message from i to j after a gossip delay, unless the link
// is down or the packet is dropped.
func (nw *network) send(i, j int, msg []byte) {
	s := nw.s
	if i == j || !nw.link[i][j] || s.chance(nw.drop) {
		return
	}
	nw.sniff(gossip.Broadcast, msg)
	to := s.nodes[j]
	life := to.life
	s.after(s.between(1, s.cfg.GossipDelay), func() { to.receive(life, gossip.Broadcast, msg) })
}

// broadcast sends msg from i to every member i sees.
func (nw *network) broadcast(i int, msg []byte) {
	for j := range nw.s.nodes {
		if nw.sees[i][j] {
			nw.send(i, j, msg)
		}
	}
}

// pushPull exchanges the full state of i and j, when they can talk both
// ways (a TCP exchange: no drops).
func (nw *network) pushPull(i, j int) {
	s := nw.s
	if i == j || !nw.bidi(i, j) || !nw.answers(i) || !nw.answers(j) {
		return
	}
	a, b := s.nodes[i], s.nodes[j]
	if s.scale != nil {
		nw.pushPullScale(a, b)
		return
	}
	ma, mb := a.state(), b.state()
	nw.sniff(gossip.PushPull, ma)
	la, lb := a.life, b.life
	d := s.between(1, s.cfg.GossipDelay)
	s.after(d, func() { b.receive(lb, gossip.PushPull, ma) })
	s.after(d, func() { a.receive(la, gossip.PushPull, mb) })
}

// join is what memberlist does when node i finds member j (a join, or a
// rejoin after a partition): a push/pull in which i gets j's state and
// member list at once, before i's machine sees the new members, so a node
// knows the current holders before its ring tells it to claim.
func (nw *network) join(i, j int) {
	s := nw.s
	if !nw.bidi(i, j) || !nw.answers(j) {
		return
	}
	a, b := s.nodes[i], s.nodes[j]
	if s.scale != nil {
		c := &s.scale.cost
		k := uint64(a.stateSize() + b.stateSize())
		c.StateMsgs += 2
		c.StateBytes += k
		c.JoinBytes += k
		c.Joins++
		c.DigestBytes += digestBytes(a, b)
		if !statesEqual(a, b) {
			a.receiveState(a.life, b.openedState())
			b.receiveState(b.life, a.openedState())
		}
	} else {
		a.receive(a.life, gossip.PushPull, b.state())
		b.receive(b.life, gossip.PushPull, a.state())
	}
	for k := range s.nodes {
		if nw.sees[j][k] && nw.reachable(i, k) && !nw.sees[i][k] {
			nw.sees[i][k] = true
			nw.flip[i][k] = 0
		}
	}
	nw.dirty[j] = true
}

// split cuts every link between the groups (both directions).
func (nw *network) split(groups ...[]int) {
	in := make([]int, len(nw.s.nodes))
	for g, members := range groups {
		for _, m := range members {
			in[m] = g + 1
		}
	}
	for i := range nw.link {
		for j := range nw.link[i] {
			nw.link[i][j] = in[i] == in[j] || in[i] == 0 || in[j] == 0
		}
	}
}

// heal restores every link and stops dropping packets.
func (nw *network) heal() {
	for i := range nw.link {
		for j := range nw.link[i] {
			nw.link[i][j] = true
			nw.blind[i][j] = false
		}
	}
	nw.drop = 0
}

// components returns the groups of running nodes that can all talk both
// ways with one another (connected by bidirectional links).
func (nw *network) components() [][]int {
	s := nw.s
	seen := make([]bool, len(s.nodes))
	var out [][]int
	for i := range s.nodes {
		if seen[i] || !nw.answers(i) {
			continue
		}
		comp := []int{i}
		seen[i] = true
		for k := 0; k < len(comp); k++ {
			for j := range s.nodes {
				if !seen[j] && nw.answers(j) && nw.bidi(comp[k], j) {
					seen[j] = true
					comp = append(comp, j)
				}
			}
		}
		slices.Sort(comp)
		out = append(out, comp)
	}
	return out
}
