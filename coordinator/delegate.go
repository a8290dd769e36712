package coordinator

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

// delegate is the coordinator's face to memberlist. memberlist calls it from
// its own goroutines, some of them under its locks: every method returns
// quickly, never blocks, and never calls back into memberlist.
type delegate struct{ c *Coordinator }

// NodeMeta implements memberlist.Delegate.
func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.c.meta) > limit {
		return nil // New checked it against memberlist's 512-byte limit
	}
	return d.c.meta
}

// NotifyMsg implements memberlist.Delegate: a gossiped claim or release.
func (d *delegate) NotifyMsg(b []byte) {
	cl, err := ownership.ParseClaim(b)
	if err != nil {
		d.c.log.Debug("dropped malformed claim", "err", err)
		return
	}
	d.c.inbox.push(cl)
}

// GetBroadcasts implements memberlist.Delegate.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.c.bq.GetBroadcasts(overhead, limit)
}

// LocalState implements memberlist.Delegate: the whole claim register, for
// push/pull anti-entropy.
func (d *delegate) LocalState(join bool) []byte {
	b, err := d.c.reg.MarshalBinary()
	if err != nil {
		d.c.log.Error("encode register", "err", err)
		return nil
	}
	return b
}

// MergeRemoteState implements memberlist.Delegate.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) == 0 {
		return
	}
	r, err := ownership.UnmarshalRegister(buf)
	if err != nil || r.Partitions() != d.c.reg.Partitions() {
		d.c.log.Warn("dropped remote state", "err", err)
		return
	}
	var cs []ownership.Claim
	for cl := range r.All() {
		cs = append(cs, cl)
	}
	d.c.inbox.push(cs...)
}

// NotifyJoin, NotifyLeave and NotifyUpdate implement memberlist.EventDelegate.
// They run under memberlist's lock, which is the one moment a *Node may be
// read: memberlist later mutates the nodes Members() returns, without a
// lock the caller can take. So the coordinator keeps its own copy.
func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.c.nodes.put(n); d.changed() }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.c.nodes.put(n); d.changed() }
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	d.c.nodes.del(n.Name, n.State == memberlist.StateLeft)
	d.changed()
}

func (d *delegate) changed() {
	select {
	case d.c.memberCh <- struct{}{}:
	default: // a refresh is already pending; it will see this change too
	}
}

// NotifyAlive implements memberlist.AliveDelegate: nodes of another cluster
// or another ring algorithm are refused.
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
	md, err := decodeMeta(n.Meta)
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

// claimBroadcast is one claim in memberlist's queue. It is named by its
// partition, so a newer claim replaces an older one still queued.
type claimBroadcast struct {
	name string
	msg  []byte
}

func (b *claimBroadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(memberlist.NamedBroadcast)
	return ok && o.Name() == b.name
}
func (b *claimBroadcast) Name() string    { return b.name }
func (b *claimBroadcast) Message() []byte { return b.msg }
func (b *claimBroadcast) Finished()       {}

// broadcast queues cl for gossip.
func (c *Coordinator) broadcast(cl ownership.Claim) {
	msg, err := cl.MarshalBinary()
	if err != nil {
		c.log.Error("encode claim", "claim", cl, "err", err)
		return
	}
	c.bq.QueueBroadcast(&claimBroadcast{name: strconv.FormatUint(uint64(cl.Token.Partition), 10), msg: msg})
}

// nodeSet is the coordinator's copy of memberlist's live members, with
// their decoded metadata.
type nodeSet struct {
	mu    sync.Mutex
	nodes map[string]nodeEntry
	left  []string // members that left gracefully since the last snapshot
}

type nodeEntry struct {
	member ownership.Member
	meta   meta
	err    error // metadata that did not decode
}

func (s *nodeSet) put(n *memberlist.Node) {
	md, err := decodeMeta(n.Meta)
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
	s.nodes[n.Name] = e
}

func (s *nodeSet) del(name string, graceful bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, name)
	if graceful {
		s.left = append(s.left, name)
	}
}

// snapshot returns the live members and the members that left gracefully
// since the last snapshot.
func (s *nodeSet) snapshot() (live []nodeEntry, left []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live = make([]nodeEntry, 0, len(s.nodes))
	for _, e := range s.nodes {
		live = append(live, e)
	}
	left, s.left = s.left, nil
	return live, left
}
