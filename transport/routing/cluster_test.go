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
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// A cluster of real coordinators and gRPC servers on loopback TCP, sharing
// one fenced resource (a MemoryFence and the log of the writes it let
// through).
type cluster struct {
	t     *testing.T
	fence *ownership.MemoryFence
	log   *writeLog
	seed  string
	nodes []*clusterNode
}

type clusterNode struct {
	name   string
	addr   string
	c      *coordinator.Coordinator
	srv    *grpc.Server
	health *Health
	stop   sync.Once
}

func newCluster(t *testing.T) *cluster {
	f, err := ownership.NewMemoryFence(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, fence: f, log: newWriteLog()}
}

func (cl *cluster) start(ctx context.Context, name string) *clusterNode {
	t := cl.t
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordConfig(name)
	cfg.ServiceAddr = lis.Addr().String()
	cfg.Fence = cl.fence // every new owner fences the resource first (S2)
	if cl.seed != "" {
		cfg.Seeds = []string{cl.seed}
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &clusterNode{name: name, addr: cfg.ServiceAddr, c: c}
	t.Cleanup(n.crash)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if cl.seed == "" {
		cl.seed = c.GossipAddr()
	}
	g, err := NewGuard(GuardConfig{Leases: c, Stale: c})
	if err != nil {
		t.Fatal(err)
	}
	n.srv = grpc.NewServer(g.ServerOptions()...)
	n.srv.RegisterService(&kvDesc, &kv{name: name, fence: cl.fence, log: cl.log})
	n.health = NewHealth(c)
	n.health.Register(n.srv)
	go func() { _ = n.srv.Serve(lis) }()
	cl.nodes = append(cl.nodes, n)
	return n
}

// crash stops the node without a goodbye: its server drops every
// connection and its coordinator stops gossiping.
func (n *clusterNode) crash() {
	n.stop.Do(func() {
		if n.srv != nil {
			n.srv.Stop()
		}
		_ = n.c.Close()
		if n.health != nil {
			n.health.Close()
		}
	})
}

// leave hands the node's partitions off, then stops its server.
func (n *clusterNode) leave(ctx context.Context) error {
	err := n.c.Leave(ctx)
	n.stop.Do(func() {
		n.srv.GracefulStop()
		n.health.Close()
	})
	return err
}

func (cl *cluster) waitConverged(ctx context.Context, nodes ...*clusterNode) {
	cl.t.Helper()
	for _, n := range nodes {
		if err := n.c.WaitConverged(ctx); err != nil {
			cl.t.Fatalf("%s: %v", n.name, err)
		}
	}
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
// through disrupt (a leave or a crash of node n2) and checks that no stale
// write was accepted and calls land on the new owners. With request ids
// every call must succeed; without, a call may fail only with an unknown
// outcome (a write in flight at a crashed owner), never with a plain
// Unavailable or a deadline.
func runScenario(t *testing.T, ids bool, disrupt func(ctx context.Context, victim *clusterNode) error) scenario {
	ctx := testCtx(t, 60*time.Second)
	cl := newCluster(t)
	n0 := cl.start(ctx, "n0")
	n1 := cl.start(ctx, "n1")
	n2 := cl.start(ctx, "n2")
	cl.waitConverged(ctx, n0, n1, n2)

	const keys = 64
	r := cl.router(n0.c) // the client routes by n0's view
	checkLanding(ctx, t, r, cl.nodes, keys)
	if len(n2.c.Table().PartitionsOf("n2")) == 0 {
		t.Fatal("n2 owns nothing: the disruption would test nothing")
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
	tenuretest.WaitFor(ctx, t, "n2 out of the survivors' tables", func() bool {
		return !n0.c.Table().Has("n2") && !n1.c.Table().Has("n2")
	})
	cl.waitConverged(ctx, n0, n1)
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
