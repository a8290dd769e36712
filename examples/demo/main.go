// Command demo runs a tenure cluster inside one process and shows what the
// library promises: five coordinators gossip over loopback, own the
// partitions of a shared in-memory resource, and keep a workload of fenced
// writes going while one node crashes, one leaves gracefully and one joins.
// It ends with a report and exits non-zero if an acknowledged write was
// lost or a stale write was accepted.
//
//	go run ./examples/demo            # about 15 seconds
//	go run ./examples/demo -nodes 7 -phase 5s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

func main() {
	nodes := flag.Int("nodes", 5, "nodes to start (at least 3)")
	partitions := flag.Int("partitions", 64, "partitions of the key space")
	phase := flag.Duration("phase", 2*time.Second, "how long the workload runs between faults")
	writers := flag.Int("writers", 4, "concurrent writers")
	flag.Parse()
	if *nodes < 3 {
		log.Fatal("demo: -nodes must be at least 3")
	}
	ok, err := run(*nodes, *partitions, *writers, *phase)
	if err != nil {
		log.Fatalf("demo: %v", err)
	}
	if !ok {
		os.Exit(1)
	}
}

// store is the protected resource: a key-value map per partition behind a
// memory fence. A write is applied only under the partition's current token.
type store struct {
	fence   *ownership.MemoryFence
	mu      sync.Mutex
	data    map[string]uint64 // key -> value
	applied map[uint64]bool   // every write applied, by sequence number
	// staleApplied counts writes applied under a token that was not the
	// partition's mark at that moment: what fencing must prevent.
	staleApplied int
}

// node is one embedded coordinator and its handler: writes to a partition
// hold its gate, Release closes the gate after the writes in flight (the
// drain), so a graceful handoff rejects nothing.
type node struct {
	name  string
	c     *coordinator.Coordinator
	gates []sync.RWMutex
	open  []bool
}

func (n *node) Acquire(ctx context.Context, l *ownership.Lease) error {
	p := l.Partition()
	n.gates[p].Lock()
	n.open[p] = true
	n.gates[p].Unlock()
	return nil
}

func (n *node) Release(ctx context.Context, l *ownership.Lease) error {
	p := l.Partition()
	n.gates[p].Lock()
	n.open[p] = false
	n.gates[p].Unlock()
	return nil
}

type cluster struct {
	partitions int
	st         *store
	seed       string
	mu         sync.Mutex
	nodes      map[string]*node

	acked, stale, retries atomic.Int64
	ackMu                 sync.Mutex
	ackedSeqs             []uint64
}

func (cl *cluster) start(ctx context.Context, name string) (*node, error) {
	n := &node{name: name, gates: make([]sync.RWMutex, cl.partitions), open: make([]bool, cl.partitions)}
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring = ring.Config{Partitions: cl.partitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	cfg.Handler = n
	cfg.Fence = cl.st.fence
	if cl.seed != "" {
		cfg.Seeds = []string{cl.seed}
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	n.c = c
	if cl.seed == "" {
		cl.seed = c.GossipAddr()
	}
	cl.mu.Lock()
	cl.nodes[name] = n
	cl.mu.Unlock()
	return n, nil
}

func (cl *cluster) list() []*node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make([]*node, 0, len(cl.nodes))
	for _, n := range cl.nodes {
		out = append(out, n)
	}
	return out
}

func (cl *cluster) take(name string) *node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := cl.nodes[name]
	delete(cl.nodes, name)
	return n
}

// write routes one write by key through the public API: ask any node who
// owns the key, take the owner's lease, write under its token.
func (cl *cluster) write(ctx context.Context, r *rand.Rand, seq uint64) bool {
	nodes := cl.list()
	key := fmt.Sprintf("key-%d", r.IntN(500))
	info, err := nodes[r.IntN(len(nodes))].c.Owner([]byte(key))
	if err != nil {
		return cl.retry()
	}
	cl.mu.Lock()
	owner := cl.nodes[info.Node]
	cl.mu.Unlock()
	if owner == nil {
		return cl.retry()
	}
	lease, err := owner.c.Lease([]byte(key))
	if err != nil {
		return cl.retry()
	}
	p := lease.Partition()
	owner.gates[p].RLock()
	defer owner.gates[p].RUnlock()
	if !owner.open[p] {
		return cl.retry()
	}
	tok := lease.Token()
	err = cl.st.fence.Do(ctx, tok, ownership.Exact, func() error {
		cl.st.mu.Lock()
		defer cl.st.mu.Unlock()
		if cl.st.fence.Current(p) != tok {
			cl.st.staleApplied++
		}
		cl.st.data[key] = seq
		cl.st.applied[seq] = true
		return nil
	})
	switch {
	case err == nil:
		cl.acked.Add(1)
		cl.ackMu.Lock()
		cl.ackedSeqs = append(cl.ackedSeqs, seq)
		cl.ackMu.Unlock()
	case errors.Is(err, ownership.ErrStaleToken):
		cl.stale.Add(1)
		owner.c.ReportStale(err)
	default:
		return cl.retry()
	}
	return true
}

// retry counts a write that found no live owner or lease and reports false,
// so the writer backs off instead of spinning through a failover.
func (cl *cluster) retry() bool {
	cl.retries.Add(1)
	return false
}

func (cl *cluster) converged(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	for {
		all := cl.list()
		done := true
		for _, n := range all {
			if t := n.c.Table(); t == nil || t.Len() != len(all) {
				done = false
			}
		}
		if done {
			for _, n := range all {
				c, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
				err := n.c.WaitConverged(c)
				cancel()
				if err != nil {
					done = false
					break
				}
			}
		}
		if done {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("cluster did not converge: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func run(nodes, partitions, writers int, phase time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fence, err := ownership.NewMemoryFence(partitions)
	if err != nil {
		return false, err
	}
	cl := &cluster{partitions: partitions, st: &store{fence: fence, data: map[string]uint64{}, applied: map[uint64]bool{}}, nodes: map[string]*node{}}
	defer func() {
		for _, n := range cl.list() {
			n.c.Close()
		}
	}()

	start := time.Now()
	for i := range nodes {
		if _, err := cl.start(ctx, fmt.Sprintf("node-%d", i)); err != nil {
			return false, err
		}
	}
	if _, err := cl.converged(ctx); err != nil {
		return false, err
	}
	fmt.Printf("%d nodes own %d partitions after %.2fs\n", nodes, partitions, time.Since(start).Seconds())

	// The status page of the first node.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return false, err
	}
	srv := &http.Server{Handler: cl.list()[0].c.StatusHandler(), ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Printf("status page: http://%s/ (JSON: ?format=json)\n", ln.Addr())

	// The workload.
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	var wg sync.WaitGroup
	defer wg.Wait()
	var seq atomic.Uint64
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for wctx.Err() == nil {
				if !cl.write(wctx, r, seq.Add(1)) {
					select {
					case <-time.After(time.Millisecond):
					case <-wctx.Done():
					}
				}
			}
		}()
	}
	progress := func(what string) {
		fmt.Printf("  %-28s acked %8d  stale rejected %4d  retries %6d\n", what, cl.acked.Load(), cl.stale.Load(), cl.retries.Load())
	}
	pause := func() {
		select {
		case <-time.After(phase):
		case <-ctx.Done():
		}
	}

	pause()
	progress("steady")

	victim := cl.take("node-1")
	t0 := time.Now()
	victim.c.Close() // a crash: no goodbye
	if _, err := cl.converged(ctx); err != nil {
		return false, err
	}
	failover := time.Since(t0)
	progress("crash of node-1")
	pause()

	leaver := cl.take("node-2")
	t0 = time.Now()
	if err := leaver.c.Leave(ctx); err != nil {
		return false, err
	}
	if _, err := cl.converged(ctx); err != nil {
		return false, err
	}
	handoff := time.Since(t0)
	staleAfterLeave := cl.stale.Load()
	progress("graceful leave of node-2")
	pause()

	if _, err := cl.start(ctx, "node-1"); err != nil { // restart, new incarnation
		return false, err
	}
	if _, err := cl.converged(ctx); err != nil {
		return false, err
	}
	progress("restart of node-1")
	pause()
	stopWriters()
	wg.Wait()

	// Check the history: every acknowledged write must have been applied,
	// and none applied under a token that was not current.
	lost := 0
	cl.st.mu.Lock()
	cl.ackMu.Lock()
	for _, seq := range cl.ackedSeqs {
		if !cl.st.applied[seq] {
			lost++
		}
	}
	cl.ackMu.Unlock()
	keys, staleApplied := len(cl.st.data), cl.st.staleApplied
	cl.st.mu.Unlock()

	fmt.Printf("\nreport: %d acknowledged writes over %d keys, %d stale writes rejected by the fence, %d lost\n",
		cl.acked.Load(), keys, cl.stale.Load(), lost)
	fmt.Printf("figure: demo.acked_writes %d\n", cl.acked.Load())
	fmt.Printf("figure: demo.stale_rejected %d\n", cl.stale.Load())
	fmt.Printf("figure: demo.lost_writes %d\n", lost)
	fmt.Printf("figure: demo.stale_accepted %d\n", staleApplied)
	fmt.Printf("figure: demo.failover_seconds %.3f\n", failover.Seconds())
	fmt.Printf("figure: demo.handoff_seconds %.3f\n", handoff.Seconds())
	fmt.Printf("figure: demo.handoff_stale_rejected %d\n", staleAfterLeave)
	return lost == 0 && staleApplied == 0 && cl.acked.Load() > 0, nil
}
