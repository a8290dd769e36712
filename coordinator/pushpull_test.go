package coordinator

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// rawPushPull opens a TCP connection to a node's gossip port and sends a
// memberlist push/pull (message type 6) of no nodes, not a join, carrying
// state as the user state: what anyone who can reach the port can send
// without being a member or showing any metadata (memberlist checks
// metadata only on joins). It reads the node's answer, so the node has
// received the whole request when it returns.
func rawPushPull(t *testing.T, addr string, state []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// memberlist's pushPullHeader, msgpack-encoded as a map of its fields.
	b := []byte{6, 0x83}
	b = append(b, 0xa5)
	b = append(b, "Nodes"...)
	b = append(b, 0x00)
	b = append(b, 0xac)
	b = append(b, "UserStateLen"...)
	b = append(b, 0xce) // uint32
	b = binary.BigEndian.AppendUint32(b, uint32(len(state)))
	b = append(b, 0xa4)
	b = append(b, "Join"...)
	b = append(b, 0xc2) // false
	b = append(b, state...)
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	// The node answers with its own state before it merges ours.
	if _, err := bufio.NewReader(conn).ReadByte(); err != nil {
		t.Fatalf("no push/pull answer from %s: %v", addr, err)
	}
}

// panicOf runs fn and returns what it panicked with, or nil.
func panicOf(fn func()) (p any) {
	defer func() { p = recover() }()
	fn()
	return nil
}

// broadcastSamples are authentic messages of the broadcast kinds, as a
// node of a cluster keyed with keys would gossip them (and as anyone on
// the path can copy them).
func broadcastSamples(t *testing.T, c *Coordinator, keys *ownership.Keyring) map[string][]byte {
	t.Helper()
	claim := gossip.Claim{Token: keys.Sign(ownership.Token{Partition: 3, Epoch: 9, Owner: c.cfg.Name, Incarnation: c.Self().Incarnation})}
	return map[string][]byte{
		"claim":  seal(t, gossip.Message{Kind: gossip.KindClaim, Cluster: c.cfg.ClusterName, Sender: c.cfg.Name, Claim: claim}, keys),
		"stable": seal(t, gossip.Message{Kind: gossip.KindStable, Cluster: c.cfg.ClusterName, Sender: c.cfg.Name, Stable: quorum.NewStable(7, []string{c.cfg.Name})}, keys),
	}
}

// ownerOfP3 starts a node alone, with token keys if keyed, and waits until
// it owns partition 3.
func ownerOfP3(ctx context.Context, t *testing.T, keyed bool, name string) (*Coordinator, *ownership.Keyring) {
	t.Helper()
	var keys *ownership.Keyring
	if keyed {
		keys = metaKeys(t, "tenure test token key, 32 bytes")
	}
	c := newTestCluster(t, func(c *Config) { c.TokenKeys = keys }).start(ctx, name).c
	testkit.WaitFor(ctx, t, "the node to own partition 3", func() bool {
		_, err := c.LeaseOfPartition(3)
		return err == nil
	})
	return c, keys
}

// Issue 19, defect 1: MergeRemoteState read the register of whatever
// message it opened, and a claim or stable membership has none: a nil
// dereference in memberlist's stream goroutine, which nothing recovers,
// so the process died. Without token keys anyone could send one; with
// them, a copy of any claim a node broadcast did it. Now the state channel
// opens only state: the messages are dropped, counted, and change nothing.
func TestMergeRemoteStateRefusesBroadcastKinds(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "unkeyed", true: "keyed"}[keyed], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, keys := ownerOfP3(ctx, t, keyed, "pp")
			before := c.reg.GetClaim(3)
			d := &delegate{c: c}
			for kind, b := range broadcastSamples(t, c, keys) {
				n := dropped(c)
				for _, join := range []bool{false, true} {
					if p := panicOf(func() { d.MergeRemoteState(b, join) }); p != nil {
						t.Fatalf("MergeRemoteState of a %s panicked (memberlist recovers nothing: the process dies): %v", kind, p)
					}
				}
				if got := dropped(c) - n; got != 2 {
					t.Errorf("a %s as push/pull state: %v dropped, want 2", kind, got)
				}
			}
			if got := c.reg.GetClaim(3); got != before {
				t.Fatalf("p3's claim is %v after the refused state, was %v", got, before)
			}
		})
	}
}

// Issue 19, defect 1, end to end: the same messages in a push/pull sent to
// the gossip port over TCP by a host that is no member. Before the fix the
// first one killed the test binary. The node must drop them, keep its
// lease and still merge an honest push/pull.
func TestPushPullOfBroadcastKindsOverTCP(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "unkeyed", true: "keyed"}[keyed], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, keys := ownerOfP3(ctx, t, keyed, "tcp")
			lease, _ := c.LeaseOfPartition(3)
			for kind, b := range broadcastSamples(t, c, keys) {
				n := dropped(c)
				rawPushPull(t, c.GossipAddr(), b)
				testkit.WaitFor(ctx, t, "the node to drop a "+kind+" sent as state", func() bool { return dropped(c) > n })
			}
			if lease.Err() != nil {
				t.Fatalf("the lease ended: %v", lease.Err())
			}
			// The loop still runs: an honest state (a release of p3 one
			// epoch above the lease) is merged, and the lease ends.
			reg, err := gossip.NewRegister(testPartitions)
			if err != nil {
				t.Fatal(err)
			}
			next := lease.Token()
			next.Epoch++
			reg.ObserveClaim(gossip.Claim{Token: keys.Sign(next), Released: true})
			rawPushPull(t, c.GossipAddr(), seal(t, gossip.Message{Kind: gossip.KindState, Cluster: c.cfg.ClusterName, Sender: "peer", Register: reg}, keys))
			select {
			case <-lease.Done():
			case <-ctx.Done():
				t.Fatal("an honest push/pull after the refused ones was not merged")
			}
		})
	}
}
