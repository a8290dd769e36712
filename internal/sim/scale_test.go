package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/reach"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// reachBound is the reach check's pings a round in a view of n.
func reachBound(n int) int { return reach.SampleSize(n) }

var (
	scaleFlag = flag.Bool("sim.scale", false, "TestScale runs the cost model's grid (COST.md): 10, 100 and 300 nodes at 1024 partitions, 10 and 30 at 16384")
	scaleOne  = flag.String("sim.point", "", "TestScale runs one point of the cost model, NxP (for example 1000x1024)")
	heapOut   = flag.String("sim.heapprofile", "", "TestScale writes a heap profile to this file once each point's cluster formed")
	pointSeed = flag.Uint64("sim.pointseed", 0, "TestScale runs its points under another seed (0: each point's own); compare a change over several")
)

// scalePoint is one measured point of the cost model: a cluster of n
// nodes and p partitions in the scale mode.
type scalePoint struct {
	n, p int
	// formed: the cluster's heap per node once formed (bytes), and one
	// node's push/pull state (bytes).
	heapPerNode, stateBytes int
	// steady, crash, join: the counts of a quiet spell, of a crash until
	// every partition is served again, of a restart until converged.
	steady, crash, join Cost
	// crashAll and joinAll: the same counts through the settling that
	// follows (a new stable membership, and the syncs it asks for).
	crashAll, joinAll Cost
	// crashTicks and joinTicks: how long those took.
	crashTicks, joinTicks int
	// joinLostQuorum: the nodes, the joiner aside, that were without a
	// quorum at some tick of the join.
	joinLostQuorum int
	elapsed        time.Duration
	violations     []string
}

// steadyTicks is the quiet spell a point measures (10 s at 200 ms a
// tick: five push/pull periods).
const steadyTicks = 50

// liveHeap returns the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// scaleConfig is a scale-mode cluster of n nodes and p partitions in the
// default timings, with the gossip authority and keys.
func scaleConfig(n, p int) Config {
	cfg := DefaultConfig(uint64(n)<<20 | uint64(p) ^ *pointSeed<<40)
	cfg.Nodes, cfg.Partitions, cfg.Scale, cfg.Keys = n, p, true, true
	return cfg
}

// runScalePoint forms a cluster (direct delivery), switches to
// memberlist's gossip, measures a quiet spell, crashes the last node and
// measures until every partition is served again, then restarts it (a
// join) and measures until the cluster converged.
func runScalePoint(t testing.TB, n, p int) scalePoint {
	start := time.Now()
	before := liveHeap()
	s, err := New(scaleConfig(n, p))
	if err != nil {
		t.Fatal(err)
	}
	pt := scalePoint{n: n, p: p}
	s.Settle()
	after := liveHeap()
	pt.heapPerNode = int((after - min(before, after)) / uint64(n))
	pt.stateBytes = s.nodes[0].stateSize()
	writeHeapProfile(t)
	s.Epidemic()
	s.ResetCost()
	s.Steady(steadyTicks)
	pt.steady = s.Cost()

	victim := n - 1
	s.ResetCost()
	s.Crash(victim)
	from := s.now
	for !s.failedOver() && int(s.now-from) <= s.settleBound() {
		s.Step()
	}
	pt.crashTicks = int(s.now - from)
	pt.crash = s.Cost()
	s.Settle()
	pt.crashAll = s.Cost()

	s.ResetCost()
	s.Restart(victim)
	from = s.now
	lost := make([]bool, n)
	for ok, _ := s.Converged(); !ok && int(s.now-from) <= s.settleBound(); ok, _ = s.Converged() {
		s.Step()
		for i, nd := range s.nodes {
			if i != victim && nd.running() && !nd.m.Quorum() && !lost[i] {
				lost[i] = true
				pt.joinLostQuorum++
			}
		}
	}
	pt.joinTicks = int(s.now - from)
	pt.join = s.Cost()
	s.Settle()
	pt.joinAll = s.Cost()
	pt.violations = s.Violations()
	pt.elapsed = time.Since(start)
	return pt
}

// writeHeapProfile writes a heap profile to -sim.heapprofile, if set.
func writeHeapProfile(t testing.TB) {
	if *heapOut == "" {
		return
	}
	f, err := os.Create(*heapOut)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatal(err)
	}
}

// perNodeSecond is x per node per second over c's ticks.
func perNodeSecond(x uint64, c Cost, n int) float64 {
	if c.Ticks == 0 {
		return 0
	}
	return float64(x) / float64(n) / (float64(c.Ticks) * tickMillis / 1000)
}

// print prints a point's figures.
func (pt scalePoint) print() {
	name := fmt.Sprintf("sim.%dx%d.", pt.n, pt.p)
	f := func(k string, format string, v any) { fmt.Printf("figure: "+name+k+" "+format+"\n", v) }
	st := pt.steady
	f("steady_packets_per_node_per_second", "%.2f", perNodeSecond(st.Packets, st, pt.n))
	f("steady_claim_bytes_per_node_per_second", "%.0f", perNodeSecond(st.ClaimBytes, st, pt.n))
	f("steady_state_msgs_per_node_per_second", "%.2f", perNodeSecond(st.StateMsgs, st, pt.n))
	f("steady_state_bytes_per_node_per_second", "%.0f", perNodeSecond(st.StateBytes, st, pt.n))
	f("steady_digest_bytes_per_node_per_second", "%.0f", perNodeSecond(st.DigestBytes, st, pt.n))
	f("reach_pings_per_node_per_second", "%.1f", perNodeSecond(st.ReachPings, st, pt.n))
	f("state_bytes", "%d", pt.stateBytes)
	f("heap_bytes_per_node", "%d", pt.heapPerNode)
	c := pt.crash
	f("crash_reowned_seconds", "%.1f", float64(pt.crashTicks)*tickMillis/1000)
	f("crash_claim_msgs_per_node_per_second", "%.2f", perNodeSecond(c.ClaimMsgs, c, pt.n))
	f("crash_claim_bytes_per_node_per_second", "%.0f", perNodeSecond(c.ClaimBytes, c, pt.n))
	f("crash_packets_per_node_per_second", "%.2f", perNodeSecond(c.Packets, c, pt.n))
	j := pt.join
	f("join_converged_seconds", "%.1f", float64(pt.joinTicks)*tickMillis/1000)
	f("join_claim_msgs_per_node_per_second", "%.2f", perNodeSecond(j.ClaimMsgs, j, pt.n))
	f("join_nodes_without_quorum", "%d", pt.joinLostQuorum)
	f("join_state_bytes_per_exchange", "%.0f", float64(j.JoinBytes)/float64(max(j.Joins, 1)))
	f("join_state_bytes_per_node_per_second", "%.0f", perNodeSecond(j.StateBytes, j, pt.n))
	f("join_syncs_per_node", "%.2f", float64(pt.joinAll.Syncs)/float64(pt.n))
	f("join_state_msgs_per_node", "%.2f", float64(pt.joinAll.StateMsgs)/float64(pt.n))
	f("crash_syncs_per_node", "%.2f", float64(pt.crashAll.Syncs)/float64(pt.n))
	f("crash_state_msgs_per_node", "%.2f", float64(pt.crashAll.StateMsgs)/float64(pt.n))
	f("run_seconds", "%.1f", pt.elapsed.Seconds())
}

// scaleGrid is the -sim.scale run's points.
var scaleGrid = [][2]int{{10, 1024}, {100, 1024}, {300, 1024}, {10, 16384}, {30, 16384}}

// TestScale runs the cost model's points (COST.md) with -sim.scale, and
// prints their figures:
//
//	go test ./internal/sim -run TestScale -sim.scale -v -timeout 60m
func TestScale(t *testing.T) {
	grid := scaleGrid
	if *scaleOne != "" {
		var n, p int
		if _, err := fmt.Sscanf(*scaleOne, "%dx%d", &n, &p); err != nil {
			t.Fatalf("-sim.point=%q: %v", *scaleOne, err)
		}
		grid = [][2]int{{n, p}}
	}
	if !*scaleFlag && *scaleOne == "" {
		checkScalePoint(t, runScalePoint(t, 10, 256))
		return
	}
	for _, g := range grid {
		pt := runScalePoint(t, g[0], g[1])
		if len(pt.violations) > 0 {
			t.Fatalf("%dx%d: %v", g[0], g[1], pt.violations)
		}
		pt.print()
	}
}

// checkScalePoint checks what a point must show whatever its size: no
// violation; a quiet cluster gossips no claim and exchanges states once a
// PushPull per node; the reach check stays within its bound; a crash and
// a join converge within the settle bound and move claims; a digest
// exchange of equal states is smaller than the states.
func checkScalePoint(t *testing.T, pt scalePoint) {
	t.Helper()
	cfg := scaleConfig(pt.n, pt.p)
	st := pt.steady
	bound := uint64(cfg.settleBoundOf())
	switch {
	case len(pt.violations) > 0:
		t.Fatalf("%dx%d: %v", pt.n, pt.p, pt.violations)
	case st.ClaimMsgs != 0 || st.Packets != 0:
		t.Errorf("a quiet cluster gossiped %d claims in %d packets", st.ClaimMsgs, st.Packets)
	case st.StateMsgs != 2*uint64(pt.n)*st.Ticks/uint64(cfg.PushPull):
		t.Errorf("%d states in %d ticks of %d nodes, want two a PushPull (%d ticks) per node", st.StateMsgs, st.Ticks, pt.n, cfg.PushPull)
	case st.ReachPings > uint64(pt.n*reachBound(pt.n))*st.Ticks:
		t.Errorf("%d reach pings in %d ticks, over %d a node a tick", st.ReachPings, st.Ticks, reachBound(pt.n))
	case uint64(pt.crashTicks) > bound || uint64(pt.joinTicks) > bound:
		t.Errorf("crash took %d ticks, join %d, bound %d", pt.crashTicks, pt.joinTicks, bound)
	case pt.crash.ClaimMsgs == 0 || pt.join.ClaimMsgs == 0 || pt.join.Joins == 0:
		t.Errorf("crash gossiped %d claims, join %d (%d joins)", pt.crash.ClaimMsgs, pt.join.ClaimMsgs, pt.join.Joins)
	case st.DigestBytes >= st.StateBytes:
		t.Errorf("digests of equal states: %d bytes, the states %d", st.DigestBytes, st.StateBytes)
	}
}

// The gossip queue holds one message per name (a newer claim of a
// partition replaces the queued one), sends each RetransmitMult x
// ceil(log10(n+1)) times, and packs what fits in a packet.
func TestGossipQueue(t *testing.T) {
	cfg := scaleConfig(10, 256)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Settle()
	s.Epidemic()
	s.ResetCost()
	n := s.nodes[0]
	n.sc.queue = nil
	tok := func(p uint32, e uint64) gossip.Message {
		return gossip.Message{Kind: gossip.KindClaim, Claim: gossip.Claim{Token: ownership.Token{Partition: p, Epoch: e, Owner: "n0", Incarnation: 1}}}
	}
	n.queueGossip(tok(1, 1), 50)
	n.queueGossip(tok(1, 2), 50)
	n.queueGossip(tok(2, 1), 50)
	if len(n.sc.queue) != 2 {
		t.Fatalf("queue holds %d messages, want 2 (p1's second claim replaces its first)", len(n.sc.queue))
	}
	limit := RetransmitMult * 2 // ceil(log10(11))
	if s.scale.limit != limit {
		t.Fatalf("retransmit limit %d, want %d", s.scale.limit, limit)
	}
	sends := 0
	for len(n.sc.queue) > 0 && sends < 10*limit {
		s.net.packet(0, 1)
		sends++
	}
	if c := s.Cost(); sends != limit || c.ClaimMsgs != uint64(2*limit) || c.Packets != uint64(limit) {
		t.Fatalf("%d packets, %d claims sent; want %d packets of both claims", c.Packets, c.ClaimMsgs, limit)
	}
	for range 40 {
		n.queueGossip(tok(uint32(10+len(n.sc.queue)), 1), 100)
	}
	s.ResetCost()
	s.net.packet(0, 1)
	if got, want := int(s.Cost().ClaimMsgs), PacketSize/(100+packetOverhead); got != want {
		t.Fatalf("a packet carried %d messages of 100 bytes, want %d", got, want)
	}
}
