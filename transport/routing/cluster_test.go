package routing

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// A tenuretest cluster of coordinators, each serving the test service on
// loopback TCP behind a guard, sharing one fenced resource (a MemoryFence
// and the log of the writes it let through).
type cluster struct {
	t     *testing.T
	tc    *tenuretest.Cluster
	log   *writeLog
	nodes []*clusterNode
}

type clusterNode struct {
	name   string
	tc     *tenuretest.Cluster
	c      *coordinator.Coordinator
	srv    *grpc.Server
	health *Health
	stop   sync.Once
}

// startCluster starts n nodes (node-0, node-1, ...), waits until they
// converged, and serves each one's service address.
func startCluster(ctx context.Context, t *testing.T, n int) *cluster {
	t.Helper()
	f, err := ownership.NewMemoryFence(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{t: t, log: newWriteLog()}
	lis := map[string]net.Listener{}
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		lis[fmt.Sprintf("node-%d", i)] = l
	}
	cl.tc, err = tenuretest.Start(ctx, tenuretest.Config{
		Nodes:      n,
		Partitions: testPartitions,
		Fence:      f, // every new owner fences the resource first (S2)
		Tweak:      func(cfg *coordinator.Config) { cfg.ServiceAddr = lis[cfg.Name].Addr().String() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.tc.Close) // after the servers stopped
	for _, name := range cl.tc.Live() {
		c := cl.tc.Node(name)
		g, err := NewGuard(GuardConfig{Leases: c, Stale: c})
		if err != nil {
			t.Fatal(err)
		}
		node := &clusterNode{name: name, tc: cl.tc, c: c, srv: grpc.NewServer(g.ServerOptions()...), health: NewHealth(c)}
		node.srv.RegisterService(&kvDesc, &kv{name: name, fence: f, log: cl.log})
		node.health.Register(node.srv)
		go func() { _ = node.srv.Serve(lis[name]) }()
		t.Cleanup(node.crash)
		cl.nodes = append(cl.nodes, node)
	}
	return cl
}

// crash stops the node without a goodbye: its server drops every
// connection and its coordinator stops gossiping.
func (n *clusterNode) crash() {
	n.stop.Do(func() {
		n.srv.Stop()
		_ = n.tc.Crash(n.name)
		n.health.Close()
	})
}

// leave hands the node's partitions off, then stops its server.
func (n *clusterNode) leave(ctx context.Context) error {
	err := n.tc.Leave(ctx, n.name)
	n.stop.Do(func() {
		n.srv.GracefulStop()
		n.health.Close()
	})
	return err
}

func (cl *cluster) router(c *coordinator.Coordinator) *Router {
	r, err := NewRouter(RouterConfig{
		Owners:      c,
		Membership:  c,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
	})
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = r.Close() })
	return r
}

// checkLanding calls keys through r and checks each lands on the owner
// that every node in nodes agrees on.
func checkLanding(ctx context.Context, t *testing.T, r *Router, nodes []*clusterNode, keys int) {
	t.Helper()
	before := r.Stats()
	for i := range keys {
		key := fmt.Sprintf("key-%d", i)
		want, err := nodes[0].c.Owner([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes[1:] {
			if o, _ := n.c.Owner([]byte(key)); o.Node != want.Node {
				t.Fatalf("%s: %s says %s owns it, %s says %s", key, nodes[0].name, want.Node, n.name, o.Node)
			}
		}
		got, err := put(ctx, r, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if got != want.Node {
			t.Fatalf("%s landed on %s, owner %s", key, got, want.Node)
		}
	}
	if after := r.Stats(); after != before {
		t.Fatalf("a converged cluster needed redirects or retries: %+v -> %+v", before, after)
	}
}

// load runs calls on keys from workers goroutines until stop is closed,
// each call with its own deadline and, with ids, a request id of its own.
// It returns the calls made, the errors seen, and among them the unknown
// outcomes.
type loadResult struct {
	calls   atomic.Int64
	errs    atomic.Int64
	unknown atomic.Int64
	mu      sync.Mutex
	first   error // the first error that is not an unknown outcome
}

func load(r *Router, workers, keys int, ids bool, stop <-chan struct{}) (*loadResult, func()) {
	res := &loadResult{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				var err error
				if ids {
					ctx, err = transport.WithRequestID(ctx, transport.NewRequestID())
				}
				if err == nil {
					_, err = put(ctx, r, fmt.Sprintf("key-%d", (i*workers+w)%keys))
				}
				cancel()
				res.calls.Add(1)
				if err != nil {
					res.errs.Add(1)
					if transport.IsOutcomeUnknown(err) {
						res.unknown.Add(1)
						continue
					}
					res.mu.Lock()
					if res.first == nil {
						res.first = err
					}
					res.mu.Unlock()
				}
			}
		}()
	}
	return res, wg.Wait
}

// scenario is the outcome of one disruption of a 3-node cluster.
type scenario struct {
	calls, errors, unknown int64
	redirects, retries     uint64
	cancelled              uint64 // attempts the router cancelled for a departed owner
	writes, staleWrites    int
	dupes                  int           // retried writes the resource recognised by their id
	recovery               time.Duration // from the disruption to convergence
}

// runScenario starts 3 nodes, checks calls land on owners, then runs load
// through disrupt (a leave or a crash of node-2) and checks that no stale
// write was accepted and calls land on the new owners. With request ids
// every call must succeed; without, a call may fail only with an unknown
// outcome (a write in flight at a crashed owner), never with a plain
// Unavailable or a deadline.
func runScenario(t *testing.T, ids bool, disrupt func(ctx context.Context, victim *clusterNode) error) scenario {
	ctx := testkit.Ctx(t, 60*time.Second)
	cl := startCluster(ctx, t, 3)
	n0, n1, n2 := cl.nodes[0], cl.nodes[1], cl.nodes[2]

	const keys = 64
	r := cl.router(n0.c) // the client routes by n0's view
	checkLanding(ctx, t, r, cl.nodes, keys)
	if len(n2.c.Table().PartitionsOf(n2.name)) == 0 {
		t.Fatal("node-2 owns nothing: the disruption would test nothing")
	}

	stop := make(chan struct{})
	res, wait := load(r, 3, keys, ids, stop)
	tenuretest.WaitFor(ctx, t, "load before the disruption", func() bool { return res.calls.Load() >= 30 })
	start := time.Now()
	if err := disrupt(ctx, n2); err != nil {
		close(stop)
		wait()
		t.Fatal(err)
	}
	tenuretest.WaitFor(ctx, t, "node-2 out of the survivors' tables", func() bool {
		return !n0.c.Table().Has(n2.name) && !n1.c.Table().Has(n2.name)
	})
	if err := cl.tc.WaitConverged(ctx, n0.name, n1.name); err != nil {
		t.Fatal(err)
	}
	recovery := time.Since(start)
	base := res.calls.Load()
	tenuretest.WaitFor(ctx, t, "load after the disruption", func() bool { return res.calls.Load() >= base+30 })
	close(stop)
	wait()

	if failed := res.errs.Load() - res.unknown.Load(); failed != 0 || (ids && res.unknown.Load() != 0) {
		t.Errorf("%d of %d calls failed, %d with an unknown outcome; first other: %v", res.errs.Load(), res.calls.Load(), res.unknown.Load(), res.first)
	}
	checkLog(t, cl.log)
	checkLanding(ctx, t, r, []*clusterNode{n0, n1}, keys)

	cl.log.mu.Lock()
	defer cl.log.mu.Unlock()
	st := r.Stats()
	return scenario{
		calls: res.calls.Load(), errors: res.errs.Load(), unknown: res.unknown.Load(),
		redirects: st.Redirects, retries: st.Retries, cancelled: st.Cancelled,
		writes: cl.log.total, staleWrites: cl.log.stale, dupes: cl.log.dupes,
		recovery: recovery,
	}
}

func leaveScenario(t *testing.T) scenario {
	return runScenario(t, true, func(ctx context.Context, n *clusterNode) error { return n.leave(ctx) })
}

func crashScenario(t *testing.T, ids bool) scenario {
	return runScenario(t, ids, func(_ context.Context, n *clusterNode) error { n.crash(); return nil })
}

func TestClusterLeave(t *testing.T) {
	s := leaveScenario(t)
	t.Logf("%+v", s)
}

func TestClusterCrash(t *testing.T) {
	for _, ids := range []bool{true, false} {
		t.Run(fmt.Sprintf("request ids %v", ids), func(t *testing.T) {
			s := crashScenario(t, ids)
			t.Logf("%+v", s)
			if s.retries == 0 {
				t.Error("no call waited for the crashed owner's partitions to move")
			}
		})
	}
}
