package coordinator

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
)

// delegate is the coordinator's face to memberlist. memberlist calls it from
// its own goroutines, some of them under its locks: every method returns
// quickly, never blocks, and never calls back into memberlist.
type delegate struct {
	c *Coordinator
	// live counts the members memberlist holds alive or suspect, this node
	// among them: what memberlist's NumMembers counts, kept by NotifyJoin
	// (a member dead, left or new becomes alive) and NotifyLeave (one
	// becomes dead or left), which memberlist calls under its node lock at
	// exactly those transitions. The broadcast queue reads it under the
	// queue's own lock; NumMembers there took memberlist's node lock under
	// the queue's, a lock convoy under load (issue 22, item 4: goroutine
	// dumps showed 38 goroutines waiting on the node lock, 30 on the
	// queue's).
	live atomic.Int64
}

// numNodes is the broadcast queue's count of members (TransmitLimitedQueue's
// NumNodes): live, and at least 1, this node, as before it joined itself
// (a count of 0 would give every broadcast no transmissions at all).
func (d *delegate) numNodes() int {
	return int(max(d.live.Load(), 1))
}

// NodeMeta implements memberlist.Delegate.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.c.meta.Load()
	if len(b) > limit {
		return nil // New checked it against memberlist's 512-byte limit
	}
	return b
}

// NotifyMsg implements memberlist.Delegate: a gossiped claim, release or
// stable membership, a section of a peer's register (the digest exchange,
// sent to this node alone), or a member's ask for this node's stable
// membership (askedStable). Whatever fails gossip.Open's checks
// for the broadcast channel is dropped, a state among them; so are the
// claims of a section whose tokens do not verify, alone (counted and
// logged by unverified). A section that asks for an answer queues one
// (offerExchange) when it is due (askDue, exchange.go). A leaver's
// goodbye, sent over a stream, is recorded (goodbye).
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) > 0 && b[0] == goodbyeMagic {
		d.goodbye(b)
		return
	}
	m, err := d.c.opener.Open(b, gossip.Broadcast)
	if err != nil {
		d.c.log.Debug("dropped gossip", "err", err)
		d.c.metrics.gossipDropped.Inc()
		return
	}
	d.unverified(m)
	d.c.inbox.push(heard{stable: m.Stable, claims: slices.Collect(m.Claims())})
	if m.Kind == gossip.KindAskStable && m.Sender != d.c.cfg.Name {
		d.askedStable(m)
		return
	}
	if m.Kind == gossip.KindSection && m.Section.Ask && m.Sender != d.c.cfg.Name {
		due := d.c.nodes.askDue(m.Sender, &m.Section, d.c.cfg.Clock.Now(), d.c.askWindow)
		if due == nil {
			d.c.traffic.asksRefused.Add(1)
			return
		}
		d.c.offerExchange(exchangeJob{peer: m.Sender, answer: due})
	}
}

// askedStable queues an answer to a member's ask for this node's stable
// membership (the machine's ActSync, loop.sync), when this node's is
// newer than the asker's own, which the ask carries, and the answer is
// due (stableDue; runStableAnswers checks again before it sends).
func (d *delegate) askedStable(m gossip.Message) {
	own := d.c.stable.Load().ID()
	if own.Compare(m.Stable.ID()) <= 0 || !d.c.nodes.stableDue(m.Sender, own, d.c.cfg.Clock.Now(), d.c.askWindow, false) {
		d.c.traffic.stableRefused.Add(1)
		return
	}
	d.c.offerStableAnswer(m.Sender)
}

// goodbye records a goodbye heard over a stream (see sayGoodbye): the
// member's drop, in the life the goodbye names, counts as graceful.
func (d *delegate) goodbye(b []byte) {
	name, md, err := decodeGoodbye(b, d.c.cfg.TokenKeys)
	if err == nil {
		err = d.c.refusal(name, md)
	}
	if err != nil {
		d.c.log.Debug("dropped goodbye", "err", err)
		d.c.metrics.gossipDropped.Inc()
		return
	}
	if !d.c.nodes.heardGoodbye(name, md.Incarnation) {
		d.c.log.Debug("goodbye of no live member", "node", name, "incarnation", md.Incarnation)
	}
}

// unverified counts the claims gossip.Open dropped from m for tokens that
// did not verify, and logs them, at most once per unverifiedLogEvery.
func (d *delegate) unverified(m gossip.Message) {
	if m.Unverified == 0 {
		return
	}
	d.c.metrics.gossipDropped.Add(float64(m.Unverified))
	d.c.traffic.unverified.Add(uint64(m.Unverified))
	if ok, held := d.c.unverifiedLog.allow(d.c.cfg.Clock.Now(), unverifiedLogEvery); ok {
		d.c.log.Warn("dropped claims whose tokens did not verify (a key rotation not yet done everywhere, or forgery)",
			"sender", m.Sender, "kind", m.Kind.String(), "claims", m.Unverified, "messages since the last such line", held)
	}
}

// unverifiedLogEvery bounds the lines unverified logs.
const unverifiedLogEvery = 10 * time.Second

// GetBroadcasts implements memberlist.Delegate.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	out := d.c.bq.GetBroadcasts(overhead, limit)
	n := 0
	for _, b := range out {
		n += len(b)
	}
	d.c.traffic.sentBcast.Add(uint64(n))
	return out
}

// LocalState implements memberlist.Delegate: the stable membership and,
// for push/pull anti-entropy, the register's digest (see exchange.go); for
// a join, the whole register, which the joiner needs.
func (d *delegate) LocalState(join bool) []byte {
	m := gossip.Message{Kind: gossip.KindDigest, Cluster: d.c.cfg.ClusterName, Sender: d.c.cfg.Name, Stable: *d.c.stable.Load()}
	if join {
		m.Kind, m.Register = gossip.KindState, d.c.reg
		d.c.traffic.wholeStates.Add(1)
	} else {
		m.Digest = d.c.reg.Digest()
	}
	b, err := m.Seal(d.c.cfg.TokenKeys)
	if err != nil {
		d.c.log.Error("encode state", "err", err)
		return nil
	}
	d.c.traffic.states.Add(1)
	d.c.traffic.stateBytes.Add(uint64(len(b)))
	if join {
		d.c.traffic.wholeStateBytes.Add(uint64(len(b)))
	}
	return b
}

// MergeRemoteState implements memberlist.Delegate: another node's state,
// from a push/pull. It runs on memberlist's stream goroutine, where
// nothing recovers a panic, and its input comes from whoever opened a TCP
// connection to the gossip port (memberlist checks metadata only on joins):
// whatever fails gossip.Open's checks for the push/pull channel, a claim or
// stable membership among them, is dropped. A whole state is merged; a
// digest that differs from this node's starts the digest exchange, from the
// side whose name sorts first (exchange.go).
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) == 0 {
		return
	}
	m, err := d.c.opener.Open(buf, gossip.PushPull)
	var diff []int
	if err == nil && m.Kind == gossip.KindDigest {
		diff, err = d.c.reg.Digest().Diff(m.Digest)
	}
	if err != nil {
		d.c.log.Warn("dropped remote state", "err", err)
		d.c.metrics.gossipDropped.Inc()
		return
	}
	d.unverified(m)
	d.c.inbox.push(heard{stable: m.Stable, claims: slices.Collect(m.Claims())})
	switch {
	case len(diff) == 0 || m.Sender == d.c.cfg.Name:
	case d.c.cfg.Name < m.Sender:
		d.c.offerExchange(exchangeJob{peer: m.Sender, ranges: diff})
	default: // the sender asks: its asks for diff are due
		if ask := d.c.nodes.openAsks(m.Sender, diff, d.c.cfg.Clock.Now(), d.c.askWindow); ask != nil {
			d.c.offerExchange(exchangeJob{peer: m.Sender, answer: ask})
		}
	}
}

// NotifyJoin, NotifyLeave and NotifyUpdate implement memberlist.EventDelegate.
// They run under memberlist's lock, which is the one moment a *Node may be
// read: memberlist later mutates the nodes Members() returns, without a
// lock the caller can take. So the coordinator keeps its own copy.
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	d.live.Add(1)
	d.c.nodes.put(n, d.c.cfg.TokenKeys)
	d.changed()
}
func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	d.c.nodes.put(n, d.c.cfg.TokenKeys)
	d.changed()
}

// NotifyLeave: a member left gracefully when this node heard its goodbye
// (its last metadata, authentic, says Gone, or its goodbye came over a
// stream) before it went. One whose last
// metadata said only Leaving may have been cut off by a split before its
// goodbye: its drop counts as a crash, or both sides of the split would
// shrink their stable membership and count a quorum (issue 19, defect 4).
// memberlist's own record (StateLeft, for a member that said goodbye) is
// not in the Node it passes here: v0.7.0 keeps the state in a field of its
// own and leaves Node.State at its zero value, StateAlive. Nor is its Meta
// read: memberlist changes it only where it also calls NotifyJoin or
// NotifyUpdate, so the entry put stored already holds it.
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	d.live.Add(-1)
	d.c.nodes.del(n.Name)
	d.changed()
}

func (d *delegate) changed() {
	select {
	case d.c.memberCh <- struct{}{}:
	default: // a refresh is already pending; it will see this change too
	}
}

// NotifyAlive implements memberlist.AliveDelegate: nodes of another cluster
// or another ring algorithm are refused, and with token keys set, nodes
// whose metadata is not authentic under them.
func (d *delegate) NotifyAlive(n *memberlist.Node) error { return d.check(n) }

// NotifyMerge implements memberlist.MergeDelegate.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if err := d.check(n); err != nil {
			return err
		}
	}
	return nil
}

// NotifyConflict implements memberlist.ConflictDelegate.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	d.c.log.Warn("name conflict", "name", existing.Name, "existing", existing.Address(), "other", other.Address())
}

func (d *delegate) check(n *memberlist.Node) error {
	md, err := decodeMeta(n.Meta, n.Name, d.c.cfg.TokenKeys)
	if err != nil {
		return fmt.Errorf("node %q: %w", n.Name, err)
	}
	return d.c.refusal(n.Name, md)
}

// refusal says why a node with metadata md may not join this cluster, or
// returns nil.
func (c *Coordinator) refusal(name string, md meta) error {
	if md.Cluster != c.cfg.ClusterName {
		return fmt.Errorf("node %q is in cluster %q, not %q", name, md.Cluster, c.cfg.ClusterName)
	}
	if md.RingVersion != ring.AlgorithmVersion {
		return fmt.Errorf("node %q runs ring %q, not %q", name, md.RingVersion, ring.AlgorithmVersion)
	}
	return nil
}

// broadcast queues m for gossip under name (the claim's partition, or
// "stable"), so a newer message replaces an older one still in the queue,
// whether it was sent yet or not: a release this node claims over before
// gossip sent it never leaves the node, and peers learn the claim, which
// supersedes it.
func (c *Coordinator) broadcast(name string, m gossip.Message) {
	m.Cluster, m.Sender = c.cfg.ClusterName, c.cfg.Name
	msg, err := m.Seal(c.cfg.TokenKeys)
	if err != nil {
		c.log.Error("encode gossip", "err", err)
		return
	}
	c.traffic.queued.Add(1)
	c.bq.QueueBroadcast(name, msg)
}

// broadcastClaim queues cl for gossip.
func (c *Coordinator) broadcastClaim(cl gossip.Claim) {
	c.broadcast(strconv.FormatUint(uint64(cl.Token.Partition), 10), gossip.Message{Kind: gossip.KindClaim, Claim: cl})
}

// broadcastStable queues s for gossip, when it fits in a packet (push/pull
// carries it in any case).
func (c *Coordinator) broadcastStable(s quorum.Stable) {
	n := 0
	for _, m := range s.Members {
		n += len(m) + 1
	}
	if n > 1000 {
		return
	}
	c.broadcast("stable", gossip.Message{Kind: gossip.KindStable, Stable: s})
}

// nodeSet is the coordinator's copy of memberlist's live members, with
// their decoded metadata.
type nodeSet struct {
	mu    sync.Mutex
	nodes map[string]nodeEntry
	left  []string         // members that left gracefully since the last snapshot
	asks  map[string]*asks // per member: which of its asks are due (exchange.go)
}

type nodeEntry struct {
	member ownership.Member
	meta   meta
	err    error // metadata that did not decode
}

// put records n; metadata that does not decode, or is not authentic under
// keys, leaves n out of every view.
func (s *nodeSet) put(n *memberlist.Node, keys *ownership.Keyring) {
	md, err := decodeMeta(n.Meta, n.Name, keys)
	e := nodeEntry{
		member: ownership.Member{Name: n.Name, GossipAddr: n.Address(), ServiceAddr: md.ServiceAddr, Incarnation: md.Incarnation},
		meta:   md,
		err:    err,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil {
		s.nodes = make(map[string]nodeEntry)
	}
	if old, ok := s.nodes[n.Name]; ok && err == nil && old.err == nil && old.meta.Gone && old.meta.Incarnation == md.Incarnation {
		e.meta.Gone = true // a goodbye heard holds for the rest of that life
	}
	s.nodes[n.Name] = e
}

// heardGoodbye marks live member name's current life as gone, if inc is
// that life's incarnation, and reports whether it was.
func (s *nodeSet) heardGoodbye(name string, inc uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[name]
	if !ok || e.err != nil || e.meta.Incarnation != inc {
		return false
	}
	e.meta.Gone = true
	s.nodes[name] = e
	return true
}

// del drops member name. It left gracefully when the life it ends said
// goodbye: by its gossiped metadata (put) or over a stream (heardGoodbye).
func (s *nodeSet) del(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[name]
	graceful := ok && e.err == nil && e.meta.Gone
	delete(s.nodes, name)
	delete(s.asks, name)
	if graceful {
		s.left = append(s.left, name)
	}
}

// snapshot returns the live members and the members that left gracefully
// since the last snapshot.
func (s *nodeSet) snapshot() (live []nodeEntry, left []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live = s.liveLocked()
	left, s.left = s.left, nil
	return live, left
}

// live returns the live entries, leaving the left names for snapshot.
func (s *nodeSet) live() []nodeEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.liveLocked()
}

func (s *nodeSet) liveLocked() []nodeEntry {
	live := make([]nodeEntry, 0, len(s.nodes))
	for _, e := range s.nodes {
		live = append(live, e)
	}
	return live
}
