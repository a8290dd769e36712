package sim

import (
	"math"
	"slices"

	"github.com/tenure-go/tenure/ownership/gossip"
)

// The scale mode (Config.Scale) is the simulator of the cost model
// (COST.md): up to MaxScaleNodes nodes, the messages counted per kind, and
// broadcasts carried as memberlist carries the coordinator's: each node
// queues its claims by partition (a newer claim of a partition replaces
// the one queued), and each gossip round sends packets of up to
// PacketSize bytes to GossipNodes members it sees; every queued message
// goes out RetransmitMult x ceil(log10(n+1)) times, fewest sent first, and
// a node that learns a claim queues it in turn. The cluster forms with
// direct delivery (each broadcast to every member, no relaying, so that a
// start of thousands of claims stays cheap), then Epidemic switches the
// gossip to the queues for the measured runs.
//
// What the scale mode leaves out, for speed: messages are opened once for
// all receivers (the same bytes open the same way on every node), there
// is no adversary, and a push/pull between two nodes whose registers and
// stable memberships are equal (the model keeps an order-independent hash
// of each register, per range of partitions) is counted but not decoded:
// merging equal states changes nothing. The same hashes give the bytes a
// digest exchange would send (issue 22: per-range hashes, then the claims
// of the ranges that differ).

// The gossip model's parameters, the coordinator's local preset
// (memberlist's DefaultLocalConfig with LocalConfig's changes; a tick is a
// 200 ms ProbeInterval).
const (
	// MaxScaleNodes bounds a scale-mode cluster.
	MaxScaleNodes = 2000
	// GossipNodes: members a gossip round sends a packet to.
	GossipNodes = 3
	// GossipRounds: gossip rounds a tick (GossipInterval 50 ms).
	GossipRounds = 4
	// RetransmitMult: memberlist's RetransmitMult (2) times the
	// coordinator's claimRetransmitFactor (3).
	RetransmitMult = 6
	// PacketSize: memberlist's UDPBufferSize; packetOverhead, its compound
	// header and a piece's length.
	PacketSize     = 1400
	packetOverhead = 2
	// maxStableBroadcast: the coordinator broadcasts a stable membership
	// only when its names fit in this many bytes (push/pull carries it in
	// any case).
	maxStableBroadcast = 1000
	// digestRange is the partitions a digest's range hash covers, and
	// digestEntry the bytes a range costs in a digest.
	digestRange = 64
	digestEntry = 8
	// scaleMaxClaims is the coordinator's bound on claims in flight per
	// node (the schedules' small clusters use 4).
	scaleMaxClaims = 16
)

// maxClaims is the machines' MaxClaims.
func (c Config) maxClaims() int {
	if c.Scale {
		return scaleMaxClaims
	}
	return 4
}

// claimRounds is how many rounds of MaxClaims claims a node needs to take
// its share of the partitions at once (a start, a join).
func (c Config) claimRounds() int {
	share := (c.Partitions + c.Nodes - 1) / c.Nodes
	return (share + c.maxClaims() - 1) / c.maxClaims()
}

// Cost counts the messages of a scale-mode run since ResetCost, summed
// over the nodes; bytes are the encoded messages' lengths.
type Cost struct {
	Ticks uint64
	// Packets are gossip packets (each carries one or more claims or
	// stable memberships).
	Packets    uint64
	ClaimMsgs  uint64
	ClaimBytes uint64
	// StableMsgs and StableBytes: stable memberships gossiped.
	StableMsgs  uint64
	StableBytes uint64
	// StateMsgs and StateBytes: push/pull states (each exchange sends
	// two), joins included; JoinBytes: the states of joins alone.
	StateMsgs  uint64
	StateBytes uint64
	// JoinBytes and Joins: the state exchanges of members that found each
	// other (a join, or a rejoin after a partition).
	JoinBytes uint64
	Joins     uint64
	// Syncs: push/pulls a machine asked for (ActSync: a member holds a
	// newer stable membership), counted in StateMsgs too.
	Syncs uint64
	// DigestBytes: what the same exchanges would send as digests (range
	// hashes both ways, then the claims of the ranges that differ).
	DigestBytes uint64
	// ReachPings: pings of the reach check.
	ReachPings uint64
}

// scaleState is the scale mode's part of a Sim.
type scaleState struct {
	epidemic bool
	cost     Cost
	limit    int // transmissions of a queued message
	seq      uint64
}

// bcast is a message in a node's gossip queue.
type bcast struct {
	name int // partition, or -1 for a stable membership
	id   uint64
	sent int
	m    gossip.Message
	size int
}

// scaleNode is a node's part in the scale mode: its gossip queue and its
// register's hashes.
type scaleNode struct {
	queue []*bcast
	ph    []uint64 // hash of each partition's claim
	rh    []uint64 // sum of ph per range of digestRange partitions
	sum   uint64
	// The size of the node's encoded state, for the register hash and
	// stable version it was computed at.
	stateLen   int
	stateKey   uint64
	stateValid bool
	// opened is a copy of the register as the last push/pull carried it,
	// shared by every exchange until the register changes (a stable
	// membership change makes each node sync with many members at once).
	opened *gossip.Register
}

// Epidemic switches a scale-mode cluster's broadcasts to memberlist's
// queues (see the scale mode).
func (s *Sim) Epidemic() {
	if s.scale != nil {
		s.scale.epidemic = true
	}
}

// Cost returns the counts since ResetCost (zero outside the scale mode).
func (s *Sim) Cost() Cost {
	if s.scale == nil {
		return Cost{}
	}
	return s.scale.cost
}

// ResetCost starts the counts over.
func (s *Sim) ResetCost() {
	if s.scale != nil {
		s.scale.cost = Cost{}
	}
}

func newScale(s *Sim) *scaleState {
	n := s.cfg.Nodes
	return &scaleState{limit: RetransmitMult * int(math.Ceil(math.Log10(float64(n+1))))}
}

// newScaleNode returns a node's scale part for a new life.
func newScaleNode(partitions int) *scaleNode {
	return &scaleNode{ph: make([]uint64, partitions), rh: make([]uint64, (partitions+digestRange-1)/digestRange)}
}

// hashClaim is a claim's hash in the register digest.
func hashClaim(c gossip.Claim) uint64 {
	if c.IsZero() {
		return 0
	}
	h := uint64(c.Token.Partition)*0x9e3779b97f4a7c15 ^ c.Token.Epoch*0xbf58476d1ce4e5b9 ^ c.Token.Incarnation*0x94d049bb133111eb
	if c.Released {
		h ^= 0x5555555555555555
	}
	for i := range len(c.Token.Owner) {
		h = (h ^ uint64(c.Token.Owner[i])) * 0x100000001b3
	}
	return h ^ h>>31
}

// observed updates n's register hashes after partition p's claim may have
// changed.
func (n *node) observed(p uint32) {
	sn := n.sc
	if sn == nil {
		return
	}
	h := hashClaim(n.reg.GetClaim(p))
	if old := sn.ph[p]; old != h {
		sn.ph[p] = h
		sn.rh[p/digestRange] += h - old
		sn.sum += h - old
		sn.stateValid, sn.opened = false, nil
	}
}

// stateSize returns the length of n's encoded push/pull state, encoding it
// only when the register or the stable membership changed.
func (n *node) stateSize() int {
	sn := n.sc
	k := sn.sum ^ n.stable.Version*0x9e3779b97f4a7c15
	if !sn.stateValid || sn.stateKey != k {
		sn.stateLen, sn.stateKey, sn.stateValid = len(n.state()), k, true
	}
	return sn.stateLen
}

// digestBytes is what a digest exchange between a and b sends: each
// side's range hashes, then each side's claims of the ranges that differ.
func digestBytes(a, b *node) uint64 {
	ra, rb := a.sc.rh, b.sc.rh
	out := uint64(2 * (16 + digestEntry*len(ra)))
	claim := uint64(claimWireSize(a))
	for r := range ra {
		if ra[r] != rb[r] {
			out += claim * uint64(rangeClaims(a, r)+rangeClaims(b, r))
		}
	}
	return out
}

// rangeClaims counts the claims a node holds in range r.
func rangeClaims(n *node, r int) int {
	k := 0
	for p := r * digestRange; p < min((r+1)*digestRange, len(n.sc.ph)); p++ {
		if n.sc.ph[p] != 0 {
			k++
		}
	}
	return k
}

// claimWireSize is the bytes a claim takes in a state: the state's length
// over its claims.
func claimWireSize(n *node) int {
	if c := n.reg.Len(); c > 0 {
		return n.stateSize() / c
	}
	return 64
}

// statesEqual reports whether a and b hold the same register and stable
// membership (by the scale mode's hashes).
func statesEqual(a, b *node) bool {
	return a.sc.sum == b.sc.sum && a.stableID == b.stableID && slices.Equal(a.sc.rh, b.sc.rh)
}

// queueGossip puts m in n's gossip queue, replacing a queued message of
// the same name.
func (n *node) queueGossip(m gossip.Message, size int) {
	sc := n.s.scale
	name := -1
	if m.Kind == gossip.KindClaim {
		name = int(m.Claim.Token.Partition)
	}
	sc.seq++
	b := &bcast{name: name, id: sc.seq, m: m, size: size}
	q := n.sc.queue
	for i, o := range q {
		if o.name == name {
			q[i] = b
			return
		}
	}
	n.sc.queue = append(q, b)
}

// direct delivers an opened message from n to every member n sees (the
// scale mode's formation).
func (nw *network) direct(i int, m gossip.Message, size int) {
	s := nw.s
	for j, to := range s.nodes {
		if j == i || !nw.sees[i][j] || !nw.link[i][j] || s.chance(nw.drop) {
			continue
		}
		s.scale.count(m, size)
		life := to.life
		ms := []gossip.Message{m}
		s.after(s.between(1, s.cfg.GossipDelay), func() { to.receiveOpened(life, ms) })
	}
}

// count adds a message to the counts.
func (sc *scaleState) count(m gossip.Message, size int) {
	if m.Kind == gossip.KindClaim {
		sc.cost.ClaimMsgs++
		sc.cost.ClaimBytes += uint64(size)
	} else {
		sc.cost.StableMsgs++
		sc.cost.StableBytes += uint64(size)
	}
}

// gossipRounds runs a tick's gossip rounds of every node with a queue.
func (nw *network) gossipRounds() {
	s := nw.s
	for i, n := range s.nodes {
		if !n.running() || len(n.sc.queue) == 0 {
			continue
		}
		for range GossipRounds {
			for _, j := range nw.gossipPeers(i) {
				nw.packet(i, j)
				if len(n.sc.queue) == 0 {
					break
				}
			}
			if len(n.sc.queue) == 0 {
				break
			}
		}
	}
}

// gossipPeers draws up to GossipNodes distinct members node i sees.
func (nw *network) gossipPeers(i int) []int {
	s := nw.s
	var out []int
	for try := 0; try < 8*GossipNodes && len(out) < GossipNodes; try++ {
		j := s.rng.IntN(len(s.nodes))
		if j != i && nw.sees[i][j] && !slices.Contains(out, j) {
			out = append(out, j)
		}
	}
	return out
}

// packet sends node i's next packet to j: the queued messages sent fewest
// times first (newest first among equals) that fit.
func (nw *network) packet(i, j int) {
	s := nw.s
	n, sc := s.nodes[i], s.scale
	q := n.sc.queue
	slices.SortFunc(q, func(a, b *bcast) int {
		if a.sent != b.sent {
			return a.sent - b.sent
		}
		if a.id > b.id {
			return -1
		}
		return 1
	})
	var ms []gossip.Message
	room := PacketSize
	keep := q[:0]
	for _, b := range q {
		if b.size+packetOverhead > room {
			keep = append(keep, b)
			continue
		}
		room -= b.size + packetOverhead
		ms = append(ms, b.m)
		sc.count(b.m, b.size)
		if b.sent++; b.sent < sc.limit {
			keep = append(keep, b)
		}
	}
	clear(q[len(keep):])
	n.sc.queue = keep
	if len(ms) == 0 {
		return
	}
	sc.cost.Packets++
	if !nw.link[i][j] || s.chance(nw.drop) {
		return
	}
	to := s.nodes[j]
	life := to.life
	s.after(s.between(1, s.cfg.GossipDelay), func() { to.receiveOpened(life, ms) })
}

// pushPullScale is the scale mode's push/pull between a and b: counted
// whole (and as a digest exchange), and carried, opened, only when the
// states differ.
func (nw *network) pushPullScale(a, b *node) {
	s := nw.s
	c := &s.scale.cost
	c.StateMsgs += 2
	c.StateBytes += uint64(a.stateSize() + b.stateSize())
	c.DigestBytes += digestBytes(a, b)
	if statesEqual(a, b) {
		return
	}
	ma, mb := a.openedState(), b.openedState()
	la, lb := a.life, b.life
	d := s.between(1, s.cfg.GossipDelay)
	s.after(d, func() { b.receiveState(lb, ma) })
	s.after(d, func() { a.receiveState(la, mb) })
}

// openedState is n's push/pull state as the receiver opens it: a copy of
// its register and its stable membership.
func (n *node) openedState() gossip.Message {
	if n.sc.opened == nil {
		r, _ := gossip.NewRegister(n.reg.Partitions())
		if _, err := r.Merge(n.reg); err != nil {
			panic(err)
		}
		n.sc.opened = r
	}
	return gossip.Message{Kind: gossip.KindState, Cluster: cluster, Sender: n.name, Stable: n.stable, Register: n.sc.opened}
}

// receiveState is receive for an opened push/pull state.
func (n *node) receiveState(life int, m gossip.Message) {
	n.input(life, func() { n.take(gossip.PushPull, m) })
}
