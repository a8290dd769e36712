package coordinator

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/ownership"
)

var (
	scaleFlag  = flag.Bool("scale", false, "TestScale runs 25 and 50 nodes x 271 and 4096 partitions (heavy: run it alone)")
	scaleStuck = flag.String("scale.stuckcpu", "", "scaleRun: write a 15 s CPU profile of the first wait for convergence of each point that takes 15 s, to this file name with the point's name appended (the profile's 15 s count in the point's times)")
	scaleCPU   = flag.String("scale.cpu", "", "scaleRun: write a CPU profile of each point's idle window (the converged cluster, quiet) to this file name with the point's name appended")
)

// nopHandler accepts every lease.
type nopHandler struct{}

func (nopHandler) Acquire(context.Context, *ownership.Lease) error { return nil }
func (nopHandler) Release(context.Context, *ownership.Lease) error { return nil }

// scaleCluster is n coordinators on loopback with the local preset, a
// memory fence and a handler that accepts everything: what a join costs,
// measured through the coordinators' own traffic counters.
type scaleCluster struct {
	t          *testing.T
	partitions int
	fence      *ownership.MemoryFence
	nodes      []*Coordinator
	// name is the point's, for file names; stuckProfiled: its
	// -scale.stuckcpu profile is written.
	name          string
	stuckProfiled bool
}

// profileStuck writes a 15 s CPU profile to file: where a cluster that
// doesn't converge spends its CPU.
func (sc *scaleCluster) profileStuck(ctx context.Context, file string) {
	f, err := os.Create(file)
	if err != nil {
		sc.t.Errorf("-scale.stuckcpu: %v", err)
		return
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		sc.t.Errorf("-scale.stuckcpu: %v", err)
		return
	}
	select { // a measurement window, not a wait
	case <-time.After(15 * time.Second):
	case <-ctx.Done():
	}
	pprof.StopCPUProfile()
	sc.t.Logf("wrote a CPU profile of the wait to %s", file)
}

func newScaleCluster(t *testing.T, partitions int) *scaleCluster {
	t.Helper()
	f, err := ownership.NewMemoryFence(partitions)
	if err != nil {
		t.Fatal(err)
	}
	sc := &scaleCluster{t: t, partitions: partitions, fence: f}
	t.Cleanup(func() {
		for _, c := range sc.nodes {
			c.Close()
		}
	})
	return sc
}

// start starts one more node, joined to the first.
func (sc *scaleCluster) start(ctx context.Context) error {
	cfg := testConfig(fmt.Sprintf("s%d", len(sc.nodes)))
	cfg.Ring.Partitions = sc.partitions
	cfg.Handler = nopHandler{}
	cfg.Fence = sc.fence
	if len(sc.nodes) > 0 {
		cfg.Seeds = []string{sc.nodes[0].GossipAddr()}
	}
	c, err := New(cfg)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	sc.nodes = append(sc.nodes, c)
	return nil
}

// check returns nil once every node sees all of them, they agree on the
// table, each holds exactly its own partitions, and the fence has every
// partition at its ring owner.
func (sc *scaleCluster) check() error {
	var fp uint64
	for i, c := range sc.nodes {
		t := c.Table()
		if t == nil || t.Len() != len(sc.nodes) {
			return fmt.Errorf("%s sees %d members, want %d", c.cfg.Name, t.Len(), len(sc.nodes))
		}
		if i == 0 {
			fp = t.Fingerprint()
		} else if t.Fingerprint() != fp {
			return fmt.Errorf("%s has another table", c.cfg.Name)
		}
		if !c.converged() {
			return fmt.Errorf("%s not settled (quorum %v, unreachable %d)", c.cfg.Name, c.quorumOK.Load(), len(c.Status().Unreachable))
		}
	}
	t := sc.nodes[0].Table()
	for p := range uint32(sc.partitions) {
		if cur, owner := sc.fence.Current(p), t.Owner(p); cur.Owner != owner {
			return fmt.Errorf("partition %d fenced by %q, ring owner %q", p, cur.Owner, owner)
		}
	}
	return nil
}

// waitQuiet waits until no node has a broadcast left to send: what a
// change cost is all sent by then.
func (sc *scaleCluster) waitQuiet(ctx context.Context) error {
	for {
		queued := 0
		for _, c := range sc.nodes {
			queued += c.bq.NumQueued()
		}
		if queued == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d broadcasts still queued", queued)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (sc *scaleCluster) waitConverged(ctx context.Context) error {
	began, said := time.Now(), time.Now()
	for {
		checkAt := time.Now()
		err := sc.check()
		if err == nil {
			return nil
		}
		// A check of every node's every partition is itself work: at
		// 100 x 4096, tens of milliseconds. Polling no more than a third
		// of the time keeps the test from slowing what it measures.
		pause := max(50*time.Millisecond, 2*time.Since(checkAt))
		if time.Since(said) >= 15*time.Second {
			said = time.Now()
			if *scaleStuck != "" && !sc.stuckProfiled {
				sc.stuckProfiled = true
				sc.profileStuck(ctx, *scaleStuck+"."+sc.name)
			}
			sc.t.Logf("%.0f s, not converged: %v; %s", time.Since(began).Seconds(), err, sc.summary())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not converged: %v; %s", err, sc.summary())
		case <-time.After(pause):
		}
	}
}

// summary says where a cluster that doesn't converge stands: the members
// its nodes see, how many have a quorum, and the unreachable members they
// report.
func (sc *scaleCluster) summary() string {
	minSeen, maxSeen, quorum, unreachable, settled := len(sc.nodes), 0, 0, 0, 0
	reasons := map[string]int{}
	for _, c := range sc.nodes {
		st := c.Status()
		seen := 0
		if t := c.Table(); t != nil {
			seen = t.Len()
		}
		minSeen, maxSeen = min(minSeen, seen), max(maxSeen, seen)
		if st.Quorum {
			quorum++
		} else {
			reasons[st.NoQuorum]++
		}
		unreachable += len(st.Unreachable)
		if c.converged() {
			settled++
		}
	}
	return fmt.Sprintf("members seen %d-%d of %d, quorum at %d, settled %d, unreachable marks %d, no quorum because %v",
		minSeen, maxSeen, len(sc.nodes), quorum, settled, unreachable, reasons)
}

// trafficTotal is what every node of a cluster sent.
type trafficTotal struct {
	streamBytes, packetBytes, states, stateBytes, syncs, metaUpdates, queued, sentBcast, wholeStateBytes uint64
}

func (sc *scaleCluster) traffic() trafficTotal {
	var s trafficTotal
	for _, c := range sc.nodes {
		t := &c.traffic
		s.streamBytes += t.streamBytes.Load()
		s.packetBytes += t.packetBytes.Load()
		s.states += t.states.Load()
		s.stateBytes += t.stateBytes.Load()
		s.syncs += t.syncs.Load()
		s.metaUpdates += t.metaUpdates.Load()
		s.queued += t.queued.Load()
		s.sentBcast += t.sentBcast.Load()
		s.wholeStateBytes += t.wholeStateBytes.Load()
	}
	return s
}

func (a trafficTotal) minus(b trafficTotal) trafficTotal {
	return trafficTotal{
		a.streamBytes - b.streamBytes, a.packetBytes - b.packetBytes, a.states - b.states,
		a.stateBytes - b.stateBytes, a.syncs - b.syncs, a.metaUpdates - b.metaUpdates,
		a.queued - b.queued, a.sentBcast - b.sentBcast, a.wholeStateBytes - b.wholeStateBytes,
	}
}

func (a trafficTotal) bytes() uint64 { return a.streamBytes + a.packetBytes }

// scaleRun starts n nodes one after the other, waits until they converge,
// measures the cluster's idle traffic for a window, then joins one more
// node and measures what its join cost above that idle rate. It prints
// the figures under scale.<n>x<partitions>.
func scaleRun(t *testing.T, n, partitions int, limit time.Duration) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), limit)
	defer cancel()
	sc := newScaleCluster(t, partitions)
	name := fmt.Sprintf("scale.%dx%d", n, partitions)
	sc.name = name
	begin, cpuBegin := time.Now(), cpuNow()
	for range n {
		t0, tr0 := time.Now(), sc.traffic()
		if err := sc.start(ctx); err != nil {
			t.Fatalf("%s: start node %d: %v", name, len(sc.nodes), err)
		}
		t.Logf("start %d: %v; sent meanwhile: %+v; rejoins so far %d", len(sc.nodes), time.Since(t0), sc.traffic().minus(tr0), sc.rejoins())
	}
	started, startCPU := time.Since(begin), cpuNow()-cpuBegin
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	converged, convergeCPU := time.Since(begin), cpuNow()-cpuBegin
	if err := sc.waitQuiet(ctx); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	quiet := time.Since(begin)

	// The idle rate, over a fixed window (a measurement, not a wait) of
	// two local push/pull intervals, scaled for 50 members.
	const window = 4 * time.Second
	if *scaleCPU != "" {
		f, err := os.Create(*scaleCPU + "." + name) // one file a point
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile() // before the Close: defers run last in, first out
	}
	idle0, at0, cpu0 := sc.traffic(), time.Now(), cpuNow()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		t.Fatalf("%s: %v", name, ctx.Err())
	}
	idle := sc.traffic().minus(idle0)
	idleFor := time.Since(at0)
	idleRate := float64(idle.bytes()) / idleFor.Seconds()
	idleCPU := (cpuNow() - cpu0).Seconds() / idleFor.Seconds() / float64(n)

	// One more node joins the converged cluster.
	before, joinAt, joinCPU0 := sc.traffic(), time.Now(), cpuNow()
	if err := sc.start(ctx); err != nil {
		t.Fatalf("%s: join: %v", name, err)
	}
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatalf("%s: after the join: %v", name, err)
	}
	joinTook, joinCPU := time.Since(joinAt), cpuNow()-joinCPU0
	if err := sc.waitQuiet(ctx); err != nil {
		t.Fatalf("%s: after the join: %v", name, err)
	}
	joinQuiet := time.Since(joinAt)
	join := sc.traffic().minus(before)
	joinBytes := float64(join.bytes()) - idleRate*joinQuiet.Seconds()

	crash := sc.crash(ctx)

	pushpull := uint64(0)
	if idle.states > 0 {
		pushpull = idle.stateBytes / idle.states
	}
	fmt.Printf("figure: %s.start_seconds %.3f\n", name, started.Seconds())
	fmt.Printf("figure: %s.converge_seconds %.3f\n", name, converged.Seconds())
	// The CPU the whole process used until then (the test's polling
	// included, which waitConverged paces): steadier from run to run than
	// the times, which depend on how soon a saturated process starts to
	// suspect members.
	fmt.Printf("figure: %s.start_cpu_seconds %.1f\n", name, startCPU.Seconds())
	fmt.Printf("figure: %s.converge_cpu_seconds %.1f\n", name, convergeCPU.Seconds())
	fmt.Printf("figure: %s.quiet_seconds %.3f\n", name, quiet.Seconds())
	fmt.Printf("figure: %s.join_quiet_seconds %.3f\n", name, joinQuiet.Seconds())
	fmt.Printf("figure: %s.gossip_bytes_per_node_per_second %.0f\n", name, idleRate/float64(n))
	fmt.Printf("figure: %s.pushpull_bytes %d\n", name, pushpull)
	// The CPU the test process used in the idle window, per node, in
	// cores: what a converged, quiet node costs (the test's own polling
	// is stopped in the window).
	fmt.Printf("figure: %s.idle_cpu_cores_per_node %.4f\n", name, idleCPU)
	fmt.Printf("figure: %s.join_seconds %.3f\n", name, joinTook.Seconds())
	fmt.Printf("figure: %s.join_cpu_seconds %.2f\n", name, joinCPU.Seconds())
	fmt.Printf("figure: %s.join_bytes %.0f\n", name, max(joinBytes, 0))
	// What the join itself exchanged: the joiner's and its seed's states,
	// each with the whole register (memberlist's member list, about 150
	// bytes a member, comes on top); join_bytes is what the whole cluster
	// sent because of the join, the claims it moved among them.
	fmt.Printf("figure: %s.join_state_bytes %d\n", name, join.wholeStateBytes)
	fmt.Printf("figure: %s.join_stream_bytes %d\n", name, join.streamBytes)
	fmt.Printf("figure: %s.join_packet_bytes %d\n", name, join.packetBytes)
	fmt.Printf("figure: %s.join_pushpull_states %d\n", name, join.states)
	fmt.Printf("figure: %s.join_syncs %d\n", name, join.syncs)
	fmt.Printf("figure: %s.join_meta_updates %d\n", name, join.metaUpdates)
	fmt.Printf("figure: %s.join_broadcasts_queued %d\n", name, join.queued)
	fmt.Printf("figure: %s.join_broadcast_bytes %d\n", name, join.sentBcast)
	// A crash: detected when the last survivor dropped the node from its
	// table; re-owned when every partition is fenced at its ring owner and
	// held there. The target is detection + Grace + 1 s.
	fmt.Printf("figure: %s.crash_detect_seconds %.3f\n", name, crash.detect.Seconds())
	fmt.Printf("figure: %s.crash_reowned_seconds %.3f\n", name, crash.reowned.Seconds())
	fmt.Printf("figure: %s.crash_target_seconds %.3f\n", name, crash.target.Seconds())
	fmt.Printf("figure: %s.crash_within_target %v\n", name, crash.reowned <= crash.target)
}

// rejoins is how many rejoins the nodes started.
func (sc *scaleCluster) rejoins() uint64 {
	var n uint64
	for _, c := range sc.nodes {
		n += counterValue(c.metrics.rejoins)
	}
	return n
}

// crashFigures are what one crash took.
type crashFigures struct{ detect, reowned, target time.Duration }

// crash closes one node without a goodbye, neither the seed nor the last
// joined, and measures until the survivors drop it and until they own
// and hold every partition again.
func (sc *scaleCluster) crash(ctx context.Context) crashFigures {
	t := sc.t
	i := len(sc.nodes) / 2
	victim := sc.nodes[i]
	sc.nodes = slices.Delete(sc.nodes, i, i+1)
	name := victim.cfg.Name
	at := time.Now()
	victim.Close()
	detected := func() bool {
		for _, c := range sc.nodes {
			if c.Table().Has(name) {
				return false
			}
		}
		return true
	}
	for !detected() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: crash of %s never detected: %s", sc.name, name, sc.summary())
		case <-time.After(10 * time.Millisecond):
		}
	}
	var f crashFigures
	f.detect = time.Since(at)
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatalf("%s: after the crash of %s: %v", sc.name, name, err)
	}
	f.reowned = time.Since(at)
	f.target = f.detect + victim.cfg.Grace + time.Second
	return f
}

// TestScale measures starts and joins at scale, behind -scale:
//
//	go test ./coordinator -run TestScale -scale -v -timeout 30m
func TestScale(t *testing.T) {
	if !*scaleFlag {
		t.Log("-scale not set: the short run is in TestFigures")
		return
	}
	for _, r := range []struct{ n, p int }{{25, 271}, {25, 4096}, {50, 271}, {50, 4096}, {100, 271}, {100, 4096}} {
		t.Run(fmt.Sprintf("%dx%d", r.n, r.p), func(t *testing.T) {
			scaleRun(t, r.n, r.p, 5*time.Minute)
		})
	}
}

// TestJoinerDoesNotRelayTheRegister: a node joining learns the whole
// register from the member it joins; it broadcasts its own claims and
// passes on what is new to the cluster, not the register the cluster
// gave it (at 4096 partitions that was 4096 claims x 12 transmissions per
// join, measured by TestScale: 108,499 broadcasts queued for one join of a
// 10-node cluster, 570 without). The bound is two broadcasts per partition
// the join moves (the joiner's claim and the release it hears and relays)
// and a few for stable memberships and retries.
func TestJoinerDoesNotRelayTheRegister(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const partitions = 271
	sc := newScaleCluster(t, partitions)
	for range 2 {
		if err := sc.start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sc.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	joiner := sc.nodes[2]
	moved := 0
	for p := range uint32(partitions) {
		if joiner.Table().Owner(p) == joiner.cfg.Name {
			moved++
		}
	}
	if got, limit := joiner.traffic.queued.Load(), uint64(2*moved+16); got > limit {
		t.Errorf("the joiner queued %d broadcasts for a join that moved %d of %d partitions to it, want at most %d", got, moved, partitions, limit)
	}
}
