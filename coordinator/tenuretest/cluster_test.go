package tenuretest_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// start starts a cluster closed when the test ends. Unless cfg has a
// logger of its own, a failed test prints the nodes' last log records.
func start(t *testing.T, ctx context.Context, cfg tenuretest.Config) *tenuretest.Cluster {
	t.Helper()
	if cfg.Logger == nil {
		logs := testkit.NewRecentLogs(300)
		cfg.Logger = slog.New(logs)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the cluster's last %d log records at Info and above:\n%s", logs.Max(), logs.Dump())
			}
		})
	}
	cl, err := tenuretest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// A crash moves the node's partitions to the others; a restart comes back
// with a new incarnation and takes its share again.
func TestCrashRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := start(t, ctx, tenuretest.Config{})
	before := cl.Node("node-2").Self().Incarnation
	if err := cl.Crash("node-2"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if live := cl.Live(); len(live) != 2 {
		t.Fatalf("live after a crash: %v", live)
	}
	for p := range uint32(32) {
		if o, _ := cl.Node("node-0").OwnerOfPartition(p); o.Node == "node-2" {
			t.Fatalf("partition %d still owned by the crashed node", p)
		}
	}
	if err := cl.Restart(ctx, "node-2"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if cl.Node("node-2").Self().Incarnation == before {
		t.Fatal("a restarted node kept its incarnation")
	}
	if err := cl.Restart(ctx, "node-2"); err == nil {
		t.Fatal("restarting a running node succeeded")
	}
}

// A 2|3 partition: the majority side converges on its own; after Heal the
// whole cluster does.
func TestPartitionHeal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := start(t, ctx, tenuretest.Config{Nodes: 5})
	if err := cl.Partition([]string{"node-0", "node-1"}, []string{"node-2", "node-3", "node-4"}); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx, "node-2", "node-3", "node-4"); err != nil {
		t.Fatal(err)
	}
	cl.Heal()
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	key := []byte("k")
	owner, err := cl.OwnerOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Node(owner).Lease(key); err != nil {
		t.Fatalf("OwnerOf named %s, which holds no lease: %v", owner, err)
	}
}

// Start returns a cluster whose every node counts its majority against
// all of them, so a minority cut off at once leaves the rest a quorum.
// Stop 29's CI failed TestPartitionHeal: the majority side of such a cut
// never settled in two minutes. A stable membership that still lacked
// the last joiner on the majority's nodes would do that; it was not
// reproduced. After a crash the stable membership lags the live nodes
// until StableAfter has passed, and WaitStable waits for that.
func TestStartWaitsForTheStableMembership(t *testing.T) {
	ctx, cancel := tenuretest.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := start(t, ctx, tenuretest.Config{Nodes: 4})
	all := []string{"node-0", "node-1", "node-2", "node-3"}
	for _, name := range all {
		if got := cl.Node(name).Status().Stable; !slices.Equal(slices.Sorted(slices.Values(got)), all) {
			t.Fatalf("after Start, %s's stable membership is %v", name, got)
		}
	}
	if err := cl.Crash("node-3"); err != nil {
		t.Fatal(err)
	}
	done, stop := context.WithCancel(ctx)
	stop()
	if err := cl.WaitStable(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitStable at once after a crash: %v (the stable membership should still hold the crashed node)", err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitStable(ctx); err != nil {
		t.Fatal(err)
	}
}

// Every wait ends with its context, and bad names are errors.
func TestBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := start(t, ctx, tenuretest.Config{Nodes: 1, Partitions: 8})
	done, stop := context.WithCancel(ctx)
	stop()
	if err := cl.WaitConverged(done, "node-0", "node-9"); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitConverged on a node that does not exist, ctx ended: %v", err)
	}
	if _, err := cl.OwnerOf(done, []byte("k")); err != nil {
		t.Fatalf("OwnerOf on a converged cluster with an ended ctx: %v (it should answer at once)", err)
	}
	if err := cl.Pause("node-9"); err == nil {
		t.Fatal("Pause of an unknown node succeeded")
	}
	if _, err := tenuretest.Start(ctx, tenuretest.Config{Nodes: -1}); err == nil {
		t.Fatal("Start with -1 nodes succeeded")
	}
	// Paused, the only node is not live: no one owns anything.
	if err := cl.Pause("node-0"); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := cl.OwnerOf(short, []byte("k")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OwnerOf with every node paused: %v", err)
	}
	if err := cl.Resume("node-0"); err != nil {
		t.Fatal(err)
	}
}

// A paused node keeps its leases (its clock stopped) while the others fence
// it out; after Resume it gives them up and the cluster converges.
func TestPauseKeepsLeasesThenFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := start(t, ctx, tenuretest.Config{})
	st := cl.Node("node-1").Status()
	var lease *ownership.Lease
	for _, p := range st.Partitions {
		if p.Local {
			lease, _ = cl.Node("node-1").LeaseOfPartition(p.Partition)
			break
		}
	}
	if lease == nil {
		t.Fatal("node-1 holds nothing")
	}
	if err := cl.Pause("node-1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx, "node-0", "node-2"); err != nil {
		t.Fatal(err)
	}
	if lease.Err() != nil {
		t.Fatalf("the paused node's lease ended while its clock was stopped: %v", lease.Err())
	}
	if err := cl.Fence().(*ownership.MemoryFence).Check(lease.Token(), ownership.Exact); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("the paused node's token after the takeover: %v", err)
	}
	if err := cl.Resume("node-1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
}

// Bind hands each node's handler its own coordinator before the first
// Acquire, on Start and on Restart: a handler can report to it.
func TestBindBeforeAcquire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	bound := map[string]*coordinator.Coordinator{}
	unbound := 0 // Acquire calls that found no coordinator bound
	started := 0 // Bind calls on a coordinator already started
	cl := start(t, ctx, tenuretest.Config{
		Nodes: 2,
		Bind: func(name string, c *coordinator.Coordinator) {
			mu.Lock()
			defer mu.Unlock()
			bound[name] = c
			if c.GossipAddr() != "" {
				started++
			}
		},
		Handler: func(name string) coordinator.Handler {
			return coordinator.HandlerFuncs{AcquireFunc: func(context.Context, *ownership.Lease) error {
				mu.Lock()
				defer mu.Unlock()
				if bound[name] == nil {
					unbound++
				}
				return nil
			}}
		},
	})
	if err := cl.Crash("node-1"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	bound["node-1"] = nil
	mu.Unlock()
	if err := cl.Restart(ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if started != 0 {
		t.Errorf("%d Bind calls after Start", started)
	}
	if unbound != 0 {
		t.Errorf("%d Acquire calls before Bind", unbound)
	}
	for _, name := range []string{"node-0", "node-1"} {
		if bound[name] != cl.Node(name) {
			t.Errorf("%s: Bind got %p, the node is %p", name, bound[name], cl.Node(name))
		}
	}
}
