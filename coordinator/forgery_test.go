package coordinator

import (
	"context"
	"errors"
	"io"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	dto "github.com/prometheus/client_model/go"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
)

// An intruder is a plain memberlist node, not a coordinator: what anyone
// who can reach a node's gossip port can run. It answers push/pull with
// whatever state it is given and can send any packet.
type intruder struct {
	ml    *memberlist.Memberlist
	meta  atomic.Pointer[[]byte]
	state []byte
}

func (d *intruder) NodeMeta(int) []byte {
	if b := d.meta.Load(); b != nil {
		return *b
	}
	return nil
}
func (d *intruder) NotifyMsg([]byte)                    {}
func (d *intruder) GetBroadcasts(int, int) [][]byte     { return nil }
func (d *intruder) LocalState(bool) []byte              { return d.state }
func (d *intruder) MergeRemoteState(buf []byte, _ bool) {}

// newIntruder starts a plain memberlist node on loopback named name, with
// node metadata md (nil: none) and push/pull state state.
func newIntruder(t *testing.T, name string, md []byte, state []byte) *intruder {
	t.Helper()
	d := &intruder{state: state}
	d.meta.Store(&md)
	mc := memberlist.DefaultLocalConfig()
	mc.Name = name
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.Delegate = d
	mc.LogOutput = io.Discard
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	d.ml = ml
	t.Cleanup(func() { _ = ml.Shutdown() })
	return d
}

// leavingMeta is node metadata that passes a coordinator's checks (right
// cluster and ring) and announces a leave, so the ring places nothing on
// the intruder.
func leavingMeta(t *testing.T, cluster string) []byte {
	t.Helper()
	b, err := meta{Cluster: cluster, RingVersion: ring.AlgorithmVersion, Incarnation: 7, Leaving: true}.encode("", nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goodbye makes the intruder leave as a coordinator does: its metadata
// says Gone, then memberlist's leave. A fresh member that joins an unkeyed
// cluster enters its stable membership at once; one that goes without a
// goodbye counts as a crash until StableAfter, and while it does, three
// nodes out of a stable set of four or five keep a quorum only as long as
// none of them is suspected for a moment (on a loaded machine one was, in
// CI: its owner stepped down and claimed the partition again, one epoch
// up). The forgeries are what this test is about, not a crash.
func (d *intruder) goodbye(t *testing.T, cluster string) {
	t.Helper()
	b, err := meta{Cluster: cluster, RingVersion: ring.AlgorithmVersion, Incarnation: 7, Leaving: true, Gone: true}.encode("", nil)
	if err != nil {
		t.Fatal(err)
	}
	d.meta.Store(&b)
	if err := d.ml.UpdateNode(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.ml.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	_ = d.ml.Shutdown()
}

// sendTo sends msg as a memberlist user message to every node: by UDP
// (best effort) and by TCP (reliable).
func (d *intruder) sendTo(t *testing.T, nodes []*testNode, msg []byte) {
	t.Helper()
	for _, n := range nodes {
		addr := n.c.GossipAddr()
		if err := d.ml.SendToAddress(memberlist.Address{Addr: addr, Name: n.name}, msg); err != nil {
			t.Fatal(err)
		}
		host, port := splitHostPort(t, addr)
		if err := d.ml.SendReliable(&memberlist.Node{Name: n.name, Addr: host, Port: port}, msg); err != nil {
			t.Fatal(err)
		}
	}
}

func splitHostPort(t *testing.T, addr string) ([]byte, uint16) {
	t.Helper()
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			p, err := strconv.Atoi(addr[i+1:])
			if err != nil {
				t.Fatal(err)
			}
			return []byte{127, 0, 0, 1}, uint16(p)
		}
	}
	t.Fatalf("address %q has no port", addr)
	return nil, 0
}

func seal(t *testing.T, m gossip.Message, keys *ownership.Keyring) []byte {
	t.Helper()
	b, err := m.Seal(keys)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dropped is the node's count of refused gossip.
func dropped(c *Coordinator) float64 {
	var m dto.Metric
	_ = c.metrics.gossipDropped.Write(&m)
	return m.GetCounter().GetValue()
}

// waitDropped waits until every node has refused at least want more gossip
// messages than before: proof that the forgeries arrived.
func waitDropped(ctx context.Context, t *testing.T, nodes []*testNode, before map[string]float64, want float64) {
	t.Helper()
	ctx, cancel := within(ctx)
	defer cancel()
	testkit.WaitFor(ctx, t, "every node to refuse the forged gossip", func() bool {
		for _, n := range nodes {
			if dropped(n.c)-before[n.name] < want {
				return false
			}
		}
		return true
	})
}

func droppedNow(nodes []*testNode) map[string]float64 {
	out := map[string]float64{}
	for _, n := range nodes {
		out[n.name] = dropped(n.c)
	}
	return out
}

// ownerOf returns the node that holds partition p's lease, and the lease.
func ownerOf(t *testing.T, tc *testCluster, p uint32) (*testNode, *ownership.Lease) {
	t.Helper()
	for _, n := range tc.all() {
		if l, err := n.c.LeaseOfPartition(p); err == nil {
			return n, l
		}
	}
	t.Fatalf("no node holds a lease on p%d", p)
	return nil, nil
}

// Issue 11, defect 2: gossip was merged from any sender. One forged claim
// with epoch 2^64-1 (from a plain memberlist node of another cluster, or
// of this one) made a partition unclaimable forever: "epoch exhausted".
// Claims broadcast by UDP and TCP, and registers pushed in a push/pull,
// that name another cluster or jump the epoch without bound are refused,
// and after the owner crashes its partitions are claimed again at sane
// epochs.
func TestForgedGossipCannotMakeAPartitionUnclaimable(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "g", 3)
	const p = 5
	owner, lease := ownerOf(t, tc, p)
	before := lease.Token()
	huge := ownership.Token{Partition: p, Epoch: math.MaxUint64, Owner: "evil", Incarnation: 1}

	// Broadcasts: another cluster's claim, and this cluster's with the
	// last epoch.
	bc := newIntruder(t, "evil", nil, nil)
	before0 := droppedNow(tc.all())
	bc.sendTo(t, tc.all(), seal(t, gossip.Message{Kind: gossip.KindClaim, Cluster: "other", Sender: "evil", Claim: gossip.Claim{Token: huge}}, nil))
	bc.sendTo(t, tc.all(), seal(t, gossip.Message{Kind: gossip.KindClaim, Cluster: "tenure", Sender: "evil", Claim: gossip.Claim{Token: huge}}, nil))
	// Each message went by UDP and TCP: four refusals per node.
	waitDropped(ctx, t, tc.all(), before0, 4)

	// Push/pull: a node with acceptable metadata whose state holds the
	// last epoch for p, in an envelope of another cluster and of this one.
	reg, err := gossip.NewRegister(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	reg.ObserveClaim(gossip.Claim{Token: huge})
	for _, cluster := range []string{"other", "tenure"} {
		before1 := droppedNow(tc.all())
		state := seal(t, gossip.Message{Kind: gossip.KindState, Cluster: cluster, Sender: "evil-" + cluster, Register: reg}, nil)
		in := newIntruder(t, "evil-"+cluster, leavingMeta(t, "tenure"), state)
		for _, n := range tc.all() {
			if _, err := in.ml.Join([]string{n.c.GossipAddr()}); err != nil {
				t.Fatalf("the intruder could not reach %s: %v", n.name, err)
			}
		}
		waitDropped(ctx, t, tc.all(), before1, 1)
		in.goodbye(t, "tenure")
	}
	// The intruders said goodbye: no one counts them for quorum any more.
	testkit.WaitFor(ctx, t, "the intruders to leave the stable membership", func() bool {
		for _, n := range tc.all() {
			if len(n.c.stable.Load().Members) != 3 {
				return false
			}
		}
		return true
	})

	for _, n := range tc.all() {
		if cl := n.c.reg.GetClaim(p); cl.Token.Epoch != before.Epoch || cl.Token.Owner != owner.name {
			t.Fatalf("%s now holds %v as p%d's claim, was %v", n.name, cl, p, before)
		}
	}
	if lease.Err() != nil {
		t.Fatalf("the owner's lease ended: %v", lease.Err())
	}

	// The partition can still move: crash its owner; a survivor claims it.
	tc.remove(owner.name).c.Close()
	tc.waitConverged(ctx)
	next, l := ownerOf(t, tc, p)
	if got := l.Token(); got.Epoch <= before.Epoch || got.Epoch > before.Epoch+3 {
		t.Fatalf("p%d re-owned by %s at %v after %v", p, next.name, got, before)
	}
}

// Issue 11, defect 2, with token keys: unsigned gossip and claims signed
// under another key are refused, even with a plausible epoch and a live
// member's name; and a stale report whose current token is unsigned, or
// jumps the epoch without bound, is not believed (ReportStale returns
// false and the lease stays live).
func TestKeyedClusterRefusesUnauthenticatedInput(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	keys, err := ownership.NewKeyring(ownership.Key("tenure test token key, 32 bytes"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := ownership.NewKeyring(ownership.Key("another cluster's token key...."))
	if err != nil {
		t.Fatal(err)
	}
	tc := newTestCluster(t, func(c *Config) { c.TokenKeys = keys })
	tc.startNodes(ctx, "k", 3)
	const p = 3
	owner, lease := ownerOf(t, tc, p)
	var rival *testNode
	for _, n := range tc.all() {
		if n != owner {
			rival = n
		}
	}
	// A claim one epoch above, in a live member's name: accepted, it would
	// supersede the owner's lease.
	next := ownership.Token{Partition: p, Epoch: lease.Token().Epoch + 1, Owner: rival.name, Incarnation: rival.c.Self().Incarnation}
	in := newIntruder(t, "evil", nil, nil)
	before := droppedNow(tc.all())
	in.sendTo(t, tc.all(), seal(t, gossip.Message{Kind: gossip.KindClaim, Cluster: "tenure", Sender: rival.name, Claim: gossip.Claim{Token: next}}, nil))
	in.sendTo(t, tc.all(), seal(t, gossip.Message{Kind: gossip.KindClaim, Cluster: "tenure", Sender: rival.name, Claim: gossip.Claim{Token: other.Sign(next)}}, other))
	waitDropped(ctx, t, tc.all(), before, 4)
	if lease.Err() != nil {
		t.Fatalf("an unauthenticated claim ended the owner's lease: %v", lease.Err())
	}
	for _, n := range tc.all() {
		if cl := n.c.reg.GetClaim(p); cl.Token.Epoch != lease.Token().Epoch {
			t.Fatalf("%s believed an unauthenticated claim: %v", n.name, cl)
		}
	}

	// Stale reports from a downstream server: the current token unsigned,
	// signed under another key, or signed but 2^64-1.
	for name, cur := range map[string]ownership.Token{
		"unsigned":        next,
		"another key":     other.Sign(next),
		"an epoch jump":   keys.Sign(ownership.Token{Partition: p, Epoch: math.MaxUint64, Owner: rival.name, Incarnation: 1}),
		"a lower current": keys.Sign(ownership.Token{Partition: p, Epoch: lease.Token().Epoch - 1, Owner: rival.name, Incarnation: 1}),
	} {
		err := ownership.Stale(lease.Token(), cur)
		if owner.c.ReportStale(err) {
			t.Errorf("ReportStale believed a report with %s as current: %v", name, err)
		}
	}
	// Not another node's lease, either.
	if owner.c.ReportStale(ownership.Stale(next, keys.Sign(ownership.Token{Partition: p, Epoch: next.Epoch + 1, Owner: "x", Incarnation: 1}))) {
		t.Error("ReportStale took a report about another node's token")
	}
	if lease.Err() != nil {
		t.Fatalf("a forged stale report ended the lease: %v", lease.Err())
	}
	if l, err := owner.c.LeaseOfPartition(p); err != nil || l != lease {
		t.Fatalf("after forged reports the owner's lease is %v, %v", l, err)
	}

	// And an authentic report is believed: the lease ends at once.
	real := keys.Sign(next)
	if _, err := tc.fence.Fence(ctx, real); err != nil {
		t.Fatal(err)
	}
	werr := tc.fence.Do(ctx, lease.Token(), ownership.Exact, func() error { return nil })
	var st *ownership.StaleTokenError
	if !errors.As(werr, &st) {
		t.Fatalf("write under a fenced-out token: %v", werr)
	}
	if !owner.c.ReportStale(werr) {
		t.Fatal("ReportStale refused an authentic report")
	}
	select {
	case <-lease.Done():
	case <-time.After(bound):
		t.Fatal("the lease did not end after an authentic stale report")
	}
	if !errors.Is(lease.Err(), ownership.ErrLeaseSuperseded) {
		t.Fatalf("lease ended with %v, want ErrLeaseSuperseded", lease.Err())
	}
}

// forgedMeta is node metadata that passes every check but authentication:
// this cluster and ring, and the stable membership id given.
func forgedMeta(t *testing.T, name string, id quorum.StableID, leaving bool, keys *ownership.Keyring) []byte {
	t.Helper()
	b, err := meta{Cluster: "tenure", RingVersion: ring.AlgorithmVersion, Incarnation: 7, Stable: id, Leaving: leaving}.encode(name, keys)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Issue 11, defect 2 (node metadata): in a cluster with token keys but no
// gossip encryption, a plain memberlist node joined with crafted metadata:
// a stable membership of version 2^64-1, so that every real node believed
// itself outdated, counted no quorum and claimed nothing, forever. With
// token keys, metadata carries a MAC for the node's name; metadata that
// is unsigned, signed under another key or made for another name is
// refused, and the node is no member. After the forgers have joined, a
// node crashes: the survivors must still re-own its partitions.
func TestForgedMetadataCannotHaltAKeyedCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	keys := metaKeys(t, "tenure test token key, 32 bytes")
	other := metaKeys(t, "another cluster's token key....")
	tc := newTestCluster(t, func(c *Config) { c.TokenKeys = keys })
	tc.startNodes(ctx, "m", 3)
	tc.waitConverged(ctx)

	huge := quorum.StableID{Version: math.MaxUint64, Hash: 1}
	forgers := []*intruder{
		newIntruder(t, "evil-unsigned", forgedMeta(t, "evil-unsigned", huge, false, nil), nil),
		newIntruder(t, "evil-leaving", forgedMeta(t, "evil-leaving", huge, true, nil), nil),
		newIntruder(t, "evil-other-key", forgedMeta(t, "evil-other-key", huge, false, other), nil),
		// Signed under the cluster's key, but for another name: a replay
		// of m2's metadata (with m2's key) under a name of its own.
		newIntruder(t, "evil-replay", forgedMeta(t, "m2", huge, false, keys), nil),
	}
	for _, in := range forgers {
		for _, n := range tc.all() {
			// A refused node's join fails; a join that succeeds has
			// delivered the metadata too.
			_, _ = in.ml.Join([]string{n.c.GossipAddr()})
		}
	}
	for _, n := range tc.all() {
		for _, e := range snapshotNames(n.c) {
			if len(e) > 4 && e[:4] == "evil" {
				t.Errorf("%s counts %s as a member", n.name, e)
			}
		}
	}

	// A crash: the survivors must claim its partitions, which needs the
	// quorum a forged stable id would take away.
	victim := tc.all()[2]
	tc.remove(victim.name).c.Close()
	tc.waitConverged(ctx)
}

// snapshotNames names the members in c's copy of memberlist's view.
func snapshotNames(c *Coordinator) []string {
	c.nodes.mu.Lock()
	defer c.nodes.mu.Unlock()
	var out []string
	for name, e := range c.nodes.nodes {
		if e.err == nil {
			out = append(out, name)
		}
	}
	return out
}

// Issue 11, defect 2 (stable membership): gossip carries the stable
// membership a node counts its quorum against, and the highest version
// won. A forged set of members that do not exist was adopted: no node
// counted a quorum of it again, for good. One of version 2^64-1 was
// adopted too, and the next change (a graceful leave) took version
// 2^64-1 + 1 = 0, "not known". Now a heard set of which no quorum is known
// (in the view or the node's own set) is not adopted: the node is outdated
// only until StableAfter passes without hearing it again. A version more
// than MaxStableJump above a node's own is ignored. With token keys,
// unsigned sets (in a push/pull, a broadcast, or the forger's metadata)
// are refused outright.
func TestForgedStableMembershipCannotHaltTheCluster(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "unkeyed", true: "keyed"}[keyed], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			var keys *ownership.Keyring
			if keyed {
				keys = metaKeys(t, "tenure test token key, 32 bytes")
			}
			tc := newTestCluster(t, func(c *Config) { c.TokenKeys = keys })
			tc.startNodes(ctx, "s", 3)
			tc.waitConverged(ctx)

			ghosts := quorum.NewStable(1<<20, []string{"ghost-1", "ghost-2", "ghost-3"})
			huge := quorum.NewStable(math.MaxUint64, names(tc.all()))
			// A push/pull whose register holds a claim (a release one epoch
			// above p's owner) that shows when the state was merged.
			const p = 5
			_, lease := ownerOf(t, tc, p)
			mark := gossip.Claim{Token: lease.Token(), Released: true}
			mark.Token.Epoch++
			mark.Token = keys.Sign(mark.Token)
			reg, err := gossip.NewRegister(testPartitions)
			if err != nil {
				t.Fatal(err)
			}
			reg.ObserveClaim(mark)
			state := seal(t, gossip.Message{Kind: gossip.KindState, Cluster: "tenure", Sender: "evil", Stable: ghosts, Register: reg}, nil)
			md := leavingMeta(t, "tenure")
			if keyed {
				md = forgedMeta(t, "evil", ghosts.ID(), true, nil)
			}
			in := newIntruder(t, "evil", md, state)
			bc := newIntruder(t, "evil-broadcast", nil, nil)
			bc.sendTo(t, tc.all(), seal(t, gossip.Message{Kind: gossip.KindStable, Cluster: "tenure", Sender: "evil-broadcast", Stable: huge}, nil))
			for _, n := range tc.all() {
				_, _ = in.ml.Join([]string{n.c.GossipAddr()})
			}
			if !keyed {
				testkit.WaitFor(ctx, t, "every node to merge the forged state", func() bool {
					for _, n := range tc.all() {
						if n.c.reg.GetClaim(p).Token.Epoch < mark.Token.Epoch {
							return false
						}
					}
					return true
				})
			}
			_ = in.ml.Leave(time.Second)
			_ = in.ml.Shutdown()

			// A graceful leave changes the stable membership at once.
			gracefulLeave(ctx, t, tc, tc.all()[0].name)
			for _, n := range tc.all() {
				if st := n.c.stable.Load(); st.Version > 1<<10 || st.Has("ghost-1") {
					t.Errorf("%s holds stable membership %v", n.name, st)
				}
			}
		})
	}
}
