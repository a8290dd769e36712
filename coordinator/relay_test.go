package coordinator

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// A claim a node relays goes out relayRetransmitFactor x RetransmitMult x
// ceil(log10(n+1)) times, after the node's own messages, which go out
// claimRetransmitFactor times as often; a relay and an own claim of one
// partition don't replace each other, and a newer relay of a partition
// replaces the older one.
func TestRelaysGoOutLessOften(t *testing.T) {
	cfg := testConfig("r0")
	cfg.Handler = nopHandler{}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const mult, members = 2, 49 // ceil(log10(50)) = 2
	d := &delegate{c: c}
	d.live.Store(members)
	c.bq, c.rq = newQueues(d.numNodes, mult)
	claim := func(p uint32, epoch uint64) gossip.Claim {
		return gossip.Claim{Token: ownership.Token{Partition: p, Epoch: epoch, Owner: "r9", Incarnation: 1}}
	}
	c.broadcastClaim(claim(1, 1), true)
	c.broadcastClaim(claim(1, 2), true) // replaces the relay of epoch 1
	c.broadcastClaim(claim(1, 3), false)
	c.broadcastClaim(claim(2, 1), true)
	if got := c.queued(); got != 3 {
		t.Fatalf("%d broadcasts queued, want 3", got)
	}
	// What each claim seals to, to count its transmissions.
	sealed := func(cl gossip.Claim) []byte {
		b, err := gossip.Message{Kind: gossip.KindClaim, Cluster: c.cfg.ClusterName, Sender: c.cfg.Name, Claim: cl}.Seal(c.cfg.TokenKeys)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	relay, own, other := sealed(claim(1, 2)), sealed(claim(1, 3)), sealed(claim(2, 1))
	var sent [3]int
	for round := 0; c.queued() > 0; round++ {
		if round > 100 {
			t.Fatalf("still %d broadcasts queued after 100 rounds", c.queued())
		}
		// Room for one message a round: the own claim goes first while
		// it is due.
		out := d.GetBroadcasts(2, len(own)+2)
		if len(out) != 1 {
			t.Fatalf("round %d: %d messages, want 1", round, len(out))
		}
		switch {
		case bytes.Equal(out[0], own):
			if sent[1] < sent[0] || sent[1] < sent[2] {
				t.Fatalf("round %d: the own claim went out after a relay", round)
			}
			sent[1]++
		case bytes.Equal(out[0], relay):
			sent[0]++
		case bytes.Equal(out[0], other):
			sent[2]++
		default:
			t.Fatalf("round %d: sent a message queued by nobody", round)
		}
	}
	want := [3]int{relayRetransmitFactor * mult * 2, claimRetransmitFactor * mult * 2, relayRetransmitFactor * mult * 2}
	if sent != want || relayRetransmitFactor >= claimRetransmitFactor {
		t.Fatalf("sent the relay, own and other claims %v times, want %v", sent, want)
	}
}

// A node that releases a partition because the ring moved it sends the
// release to the new owner directly, besides gossip: one packet per
// partition the join moved.
func TestReleaseGoesToTheNewOwner(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "t", 1)
	first := tc.nodes["t0"].c
	tc.start(ctx, "t1")
	tc.waitConverged(ctx)
	moved := uint64(0)
	for p := range uint32(testPartitions) {
		if first.Table().Owner(p) == "t1" {
			moved++
		}
	}
	sent, left := first.traffic.releasesSent.Load(), first.traffic.releasesLeft.Load()
	if moved == 0 || sent == 0 || sent+left != moved {
		t.Fatalf("the join moved %d partitions; t0 sent %d releases to t1 directly and left %d to gossip", moved, sent, left)
	}
}
