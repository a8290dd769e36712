package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// testPartitions keeps cluster tests quick; the algorithm is the same at 271.
const testPartitions = 32

// gatedHandler is the handler a well-behaved application writes: writes to
// a partition hold its gate open for reading; Release closes the gate,
// waiting for writes in flight (the drain), so no write of the old owner can
// land after the release is published.
type gatedHandler struct {
	mu       [testPartitions]sync.RWMutex
	open     [testPartitions]bool
	acquired atomic.Int64
	released atomic.Int64
}

func (h *gatedHandler) Acquire(ctx context.Context, l *ownership.Lease) error {
	p := l.Partition()
	h.mu[p].Lock()
	h.open[p] = true
	h.mu[p].Unlock()
	h.acquired.Add(1)
	return nil
}

func (h *gatedHandler) Release(ctx context.Context, l *ownership.Lease) error {
	p := l.Partition()
	h.mu[p].Lock()
	h.open[p] = false
	h.mu[p].Unlock()
	h.released.Add(1)
	return nil
}

// write runs fn with the partition's gate open, or reports false.
func (h *gatedHandler) write(p uint32, fn func()) bool {
	h.mu[p].RLock()
	defer h.mu[p].RUnlock()
	if !h.open[p] {
		return false
	}
	fn()
	return true
}

type testNode struct {
	name string
	c    *Coordinator
	h    *gatedHandler
}

// testCluster stays private: tenuretest.Cluster imports coordinator, so these in-package tests can't import it (an import cycle).
type testCluster struct {
	t     *testing.T
	fence *ownership.MemoryFence
	seed  string
	mu    sync.Mutex
	nodes map[string]*testNode
	tweak func(*Config)
	// logs keeps the cluster's recent Info and higher records; a failed
	// test prints them with the machine's load, so a reader can tell an
	// overloaded machine from a defect.
	logs *testkit.RecentLogs
}

func newTestCluster(t *testing.T, tweak func(*Config)) *testCluster {
	t.Helper()
	f, err := ownership.NewMemoryFence(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, fence: f, nodes: map[string]*testNode{}, tweak: tweak, logs: testkit.NewRecentLogs(300)}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("machine: %s", slowtest.Describe())
			t.Logf("the cluster's last %d log records at Info and above:\n%s", tc.logs.Max(), tc.logs.Dump())
		}
		for _, n := range tc.all() {
			n.c.Close()
		}
	})
	return tc
}

func testConfig(name string) Config {
	cfg := LocalConfig()
	cfg.Name = name
	cfg.Ring.Partitions = testPartitions
	cfg.Rand = rand.New(rand.NewPCG(uint64(len(name)), uint64(time.Now().UnixNano())))
	return cfg
}

// start starts a node and joins it to the first node started.
func (tc *testCluster) start(ctx context.Context, name string) *testNode {
	tc.t.Helper()
	h := &gatedHandler{}
	cfg := testConfig(name)
	cfg.Handler = h
	cfg.Fence = tc.fence
	cfg.ServiceAddr = "svc-" + name
	cfg.Logger = slog.New(tc.logs)
	if tc.seed != "" {
		cfg.Seeds = []string{tc.seed}
	}
	if tc.tweak != nil {
		tc.tweak(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		tc.t.Fatal(err)
	}
	if tc.seed == "" {
		tc.seed = c.GossipAddr()
	}
	n := &testNode{name: name, c: c, h: h}
	tc.mu.Lock()
	tc.nodes[name] = n
	tc.mu.Unlock()
	return n
}

// startNodes starts nodes prefix0 .. prefix<n-1> and waits until they
// converged.
func (tc *testCluster) startNodes(ctx context.Context, prefix string, n int) {
	tc.t.Helper()
	for i := range n {
		tc.start(ctx, fmt.Sprintf("%s%d", prefix, i))
	}
	tc.waitConverged(ctx)
	tc.waitStable(ctx)
}

// waitStable waits until every live node's stable membership, which it
// counts its quorum against, is the live nodes: a join can enter it only
// after StableAfter (see tenuretest.WaitStable), and a test that cuts off
// a minority before then may leave the rest no quorum.
func (tc *testCluster) waitStable(ctx context.Context) {
	tc.t.Helper()
	nodes := tc.all()
	want := make([]string, 0, len(nodes))
	for _, n := range nodes {
		want = append(want, n.name)
	}
	slices.Sort(want)
	err := testkit.Check(ctx, func() error {
		for _, n := range nodes {
			if got := n.c.Status().Stable; !slices.Equal(got, want) {
				return fmt.Errorf("%s's stable membership is %v, want %v", n.name, got, want)
			}
		}
		return nil
	})
	if err != nil {
		tc.t.Fatalf("waiting for the stable membership: %v", err)
	}
}

func (tc *testCluster) all() []*testNode {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	var out []*testNode
	for _, n := range tc.nodes {
		out = append(out, n)
	}
	return out
}

func (tc *testCluster) remove(name string) *testNode {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	n := tc.nodes[name]
	delete(tc.nodes, name)
	return n
}

func (tc *testCluster) node(name string) *testNode {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.nodes[name]
}

// waitConverged waits until every live node sees all of them, agrees on the
// table, and holds exactly its own partitions.
func (tc *testCluster) waitConverged(ctx context.Context) {
	tc.t.Helper()
	tc.waitConvergedAmong(ctx, tc.all())
}

// waitConvergedAmong is waitConverged for a subset of the nodes (one side of
// a partition).
func (tc *testCluster) waitConvergedAmong(ctx context.Context, nodes []*testNode) {
	tc.t.Helper()
	if err := testkit.Check(ctx, func() error { return tc.checkConverged(nodes) }); err != nil {
		tc.t.Fatalf("waiting for the cluster to converge: %v", err)
	}
}

func (tc *testCluster) checkConverged(nodes []*testNode) error {
	var fp uint64
	for i, n := range nodes {
		t := n.c.Table()
		if t == nil || t.Len() != len(nodes) {
			return fmt.Errorf("%s sees %d members, want %d", n.name, t.Len(), len(nodes))
		}
		if i == 0 {
			fp = t.Fingerprint()
		} else if t.Fingerprint() != fp {
			return fmt.Errorf("%s has another table", n.name)
		}
		if !n.c.converged() {
			return fmt.Errorf("%s not settled: %s", n.name, tc.why(n))
		}
	}
	// Every partition is held, at the fence, by its ring owner.
	for p := range testPartitions {
		owner := nodes[0].c.Table().Owner(uint32(p))
		if cur := tc.fence.Current(uint32(p)); cur.Owner != owner {
			return fmt.Errorf("partition %d fenced by %q, ring owner %q", p, cur.Owner, owner)
		}
	}
	return nil
}

// why describes the first partition n is not settled on.
func (tc *testCluster) why(n *testNode) string {
	t := n.c.Table()
	for p := range testPartitions {
		owner := t.Owner(uint32(p))
		cl := n.c.reg.GetClaim(uint32(p))
		l := n.c.leases.lookup(uint32(p))
		if cl.Released || cl.Token.Owner != owner || (owner == n.name) != (l != nil) {
			s := fmt.Sprintf("p%d ring owner %s, claim %v, lease %v", p, owner, cl, l)
			if o := tc.node(owner); o != nil {
				s += fmt.Sprintf("; at owner: claim %v, lease %v", o.c.reg.GetClaim(uint32(p)), o.c.leases.lookup(uint32(p)))
			}
			return s
		}
	}
	return "?"
}

// writer keeps writing through the public API: find the key's owner, take
// its lease and write under the lease's token at the fence, exactly as an
// application would. It counts writes the fence rejected as stale.
type writer struct {
	tc       *testCluster
	acked    atomic.Int64
	rejected atomic.Int64
	retries  atomic.Int64

	mu    sync.Mutex
	since time.Time // what the rejections' times count from
	notes []string  // the first rejections, for a failure's message
}

// note keeps what a rejection shows about its cause: when, which lease,
// which token the fence held, and why the lease ended, if it had.
func (w *writer) note(owner string, lease *ownership.Lease, werr error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.notes) >= 20 {
		return
	}
	at := "before the leave"
	if !w.since.IsZero() {
		at = fmt.Sprintf("%v into the leave", time.Since(w.since).Round(time.Millisecond))
	}
	view := "no table"
	if n := w.tc.node(owner); n != nil {
		if t := n.c.Table(); t != nil {
			view = fmt.Sprintf("its ring: %d members, p%d on %s", t.Len(), lease.Partition(), t.Owner(lease.Partition()))
		}
	}
	w.notes = append(w.notes, fmt.Sprintf("%s: %s's lease %v rejected (%v); lease error: %v; %s", at, owner, lease.Token(), werr, lease.Err(), view))
}

// rejections returns the kept notes, one a line.
func (w *writer) rejections() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.notes, "\n")
}

func (w *writer) run(ctx context.Context, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for ctx.Err() == nil {
		nodes := w.tc.all()
		if len(nodes) == 0 {
			return
		}
		key := fmt.Appendf(nil, "key-%d", r.IntN(1000))
		info, err := nodes[r.IntN(len(nodes))].c.Owner(key)
		owner := w.tc.node(info.Node)
		if err != nil || owner == nil {
			w.retries.Add(1)
			continue
		}
		lease, err := owner.c.Lease(key)
		if err != nil {
			w.retries.Add(1)
			continue
		}
		var werr error
		ok := owner.h.write(lease.Partition(), func() {
			werr = w.tc.fence.Do(ctx, lease.Token(), ownership.Exact, func() error { return nil })
		})
		switch {
		case !ok:
			w.retries.Add(1)
		case errors.Is(werr, ownership.ErrStaleToken):
			w.rejected.Add(1)
			w.note(owner.name, lease, werr)
			owner.c.ReportStale(werr)
		case werr == nil:
			w.acked.Add(1)
		}
	}
}

func TestClusterJoinConverges(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "n", 3)
	// A fourth joins: partitions move to it, and only those change epoch.
	before := map[int]ownership.Token{}
	for p := range testPartitions {
		before[p] = tc.fence.Current(uint32(p))
	}
	tc.start(ctx, "n3")
	tc.waitConverged(ctx)
	moved := 0
	for p := range testPartitions {
		now := tc.fence.Current(uint32(p))
		if now.Owner == "n3" {
			moved++
			if now.Epoch <= before[p].Epoch {
				t.Errorf("partition %d moved without a new epoch: %v -> %v", p, before[p], now)
			}
		} else if now != before[p] {
			t.Errorf("partition %d changed epoch without changing owner: %v -> %v", p, before[p], now)
		}
	}
	if moved == 0 {
		t.Fatal("no partition moved to the new node")
	}
	// The Owner answer names the owner's service address and token.
	n0 := tc.node("n0")
	info, err := n0.c.Owner([]byte("some key"))
	if err != nil || info.Addr != "svc-"+info.Node || info.Token.Owner != info.Node {
		t.Fatalf("Owner = %+v, %v", info, err)
	}
	if _, err := tc.node(info.Node).c.Lease([]byte("some key")); err != nil {
		t.Fatalf("owner has no lease: %v", err)
	}
	other := "n0"
	if info.Node == "n0" {
		other = "n1"
	}
	_, err = tc.node(other).c.Lease([]byte("some key"))
	var noe *ownership.NotOwnerError
	if !errors.As(err, &noe) || noe.Owner.Node != info.Node {
		t.Fatalf("non-owner Lease error = %v, want NotOwnerError naming %s", err, info.Node)
	}
}

func TestClusterGracefulLeaveHasNoRejectedWrites(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "n", 4)
	handoff, w := gracefulLeave(ctx, t, tc, "n2")
	rejected, acked := w.rejected.Load(), w.acked.Load()
	if rejected != 0 {
		t.Fatalf("%d writes rejected during a graceful leave, want 0; the first:\n%s", rejected, w.rejections())
	}
	if acked == 0 {
		t.Fatal("the writer made no write")
	}
	t.Logf("handoff %v, %d writes", handoff, acked)
}

// gracefulLeave makes name leave under continuous writes and returns the
// time until the rest converged, and the writer (its counts and notes).
func gracefulLeave(ctx context.Context, t *testing.T, tc *testCluster, name string) (time.Duration, *writer) {
	w := &writer{tc: tc}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(wctx, uint64(i))
		}()
	}
	testkit.WaitFor(ctx, t, "writes before the leave", func() bool { return w.acked.Load() > 100 })
	leaver := tc.node(name)
	start := time.Now()
	w.mu.Lock()
	w.since = start
	w.mu.Unlock()
	tc.remove(name)
	if err := leaver.c.Leave(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	tc.waitConverged(ctx)
	elapsed := time.Since(start)
	base := w.acked.Load()
	testkit.WaitFor(ctx, t, "writes after the leave", func() bool { return w.acked.Load() > base+100 })
	stop()
	wg.Wait()
	return elapsed, w
}

func TestClusterCrashFailover(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "n", 3)
	owned := tc.node("n1").h.acquired.Load()
	if owned == 0 {
		t.Fatal("n1 owns nothing")
	}
	crashed := tc.remove("n1")
	crashed.c.Close() // no Leave: a crash
	tc.waitConverged(ctx)
	for p := range testPartitions {
		if cur := tc.fence.Current(uint32(p)); cur.Owner == "n1" {
			t.Fatalf("partition %d still fenced by the crashed node", p)
		}
	}
	// The crashed node's leases ended with it.
	if n, _ := crashed.c.Lease([]byte("x")); n != nil {
		t.Fatal("a closed coordinator still returns a lease")
	}
}

func TestClusterRestartWithNewIncarnation(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "n", 3)
	old := tc.remove("n2")
	oldInc := old.c.Self().Incarnation
	old.c.Close()
	tc.waitConverged(ctx)
	// Same name, new process: a new incarnation on a new port.
	n := tc.start(ctx, "n2")
	if n.c.Self().Incarnation == oldInc {
		t.Fatal("restart reused the incarnation")
	}
	tc.waitConverged(ctx)
	for p := range testPartitions {
		if cur := tc.fence.Current(uint32(p)); cur.Owner == "n2" && cur.Incarnation != n.c.Self().Incarnation {
			t.Fatalf("partition %d fenced by the old incarnation", p)
		}
	}
}

func TestOtherClusterRefused(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.start(ctx, "a0")
	tc.start(ctx, "a1")
	tc.waitConverged(ctx)
	cfg := testConfig("b0")
	cfg.ClusterName = "other"
	cfg.Handler = HandlerFuncs{}
	b := startAlone(ctx, t, cfg)
	jerr := b.Join(ctx, []string{tc.seed})
	// Whether or not memberlist reports the refusal on join, neither side may
	// place the other in its table.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if tb := b.Table(); tb != nil && tb.Len() != 1 {
			t.Fatalf("other cluster's node sees %v (join err %v)", tb.Members(), jerr)
		}
		for _, n := range tc.all() {
			if n.c.Table().Has("b0") {
				t.Fatal("cluster placed a node of another cluster")
			}
		}
		<-time.After(20 * time.Millisecond) // watching that nothing happens for a while
	}
}

func TestWrongGossipKeyRefused(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key1 := []byte("0123456789abcdef")
	key2 := []byte("fedcba9876543210")
	tc := newTestCluster(t, func(c *Config) { c.GossipKeys = [][]byte{key1} })
	tc.start(ctx, "k0")
	tc.start(ctx, "k1")
	tc.waitConverged(ctx)
	cfg := testConfig("k2")
	cfg.GossipKeys = [][]byte{key2}
	cfg.Handler = HandlerFuncs{}
	cfg.Seeds = []string{tc.seed}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Start tries again until its context ends: bound it.
	startCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	if err := c.Start(startCtx); err == nil {
		t.Fatal("a node with the wrong gossip key joined")
	}
	// Rotation: add the new key everywhere, make it primary everywhere,
	// then a node with only the new key joins.
	for _, n := range tc.all() {
		if err := n.c.GossipKeyring().AddKey(key2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range tc.all() {
		if err := n.c.GossipKeyring().UseKey(key2); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Name = "k3"
	c3, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := c3.Start(ctx); err != nil {
		t.Fatalf("join after key rotation: %v", err)
	}
}

// A leave soon after a crash, well within StableAfter: the nodes that joined
// early count quorum against a stable set that must already include the
// later joiners and drop the node that left, or the survivors (3 of 5)
// would think themselves a minority and give everything up.
func TestClusterLeaveSoonAfterCrash(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "n", 5)
	tc.remove("n1").c.Close()
	tc.waitConverged(ctx)
	if err := tc.remove("n2").c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	tc.waitConverged(ctx)
}

// startAlone starts a coordinator of cfg (its Seeds, if any, are joined)
// and closes it when the test ends.
func startAlone(ctx context.Context, t *testing.T, cfg Config) *Coordinator {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}
