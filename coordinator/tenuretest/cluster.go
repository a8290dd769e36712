package tenuretest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// Config configures a test cluster. Every field is optional.
type Config struct {
	// Nodes is how many nodes Start starts, named node-0, node-1, ...
	// Default 3.
	Nodes int
	// Partitions is the ring's partition count. Default 32.
	Partitions int
	// Handler returns the Handler of the node called name; it is called
	// again when Restart starts the node anew. Default: a handler that
	// does nothing.
	Handler func(name string) coordinator.Handler
	// Bind, when set, is called with each node's coordinator after it is
	// built and before it starts (so before its Handler's first call), on
	// every Start and Restart: a handler that reports to its own
	// coordinator (ReportStale, Resign) takes it here, as
	// coordinator/worker's Runtime.Bind does.
	Bind func(name string, c *coordinator.Coordinator)
	// Fence is every node's Config.Fence. Default: one memory fence the
	// nodes share (Cluster.Fence).
	Fence ownership.Fence
	// Tweak, when set, changes each node's Config after the harness set
	// it up (coordinator.LocalConfig with the fields above).
	Tweak func(*coordinator.Config)
	// Logger receives the nodes' logs. Default: discard.
	Logger *slog.Logger
	// Seed seeds the fault network's randomness (drops). Default 1.
	Seed uint64
}

// Cluster is a running test cluster. Its methods are safe for concurrent
// use.
type Cluster struct {
	cfg   Config
	net   *faultnet.Network
	fence ownership.Fence

	mu     sync.Mutex
	nodes  map[string]*node
	order  []string // every name ever started, in order
	closed bool
}

type node struct {
	c     *coordinator.Coordinator
	tr    *faultnet.Transport
	clock *pausableClock
	// paused: cut off and clock stopped (Pause); crashed: Closed.
	paused, crashed bool
}

// Start starts cfg.Nodes nodes, joins them and waits until they converged
// and every node's stable membership holds them all (WaitStable), or ctx
// ends. So a test may cut off or crash a minority as soon as Start returns
// and the rest keep a quorum: a node counts its majority against its
// stable membership, which can lag a join by up to StableAfter or
// 2 x Grace. On error the nodes started so far are closed.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes < 0 || cfg.Partitions < 0 {
		return nil, errors.New("tenuretest: Config.Nodes and Partitions must not be negative")
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 32
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	cl := &Cluster{cfg: cfg, net: faultnet.New(faultnet.WithSeed(cfg.Seed)), fence: cfg.Fence, nodes: map[string]*node{}}
	if cl.fence == nil {
		f, err := ownership.NewMemoryFence(cfg.Partitions)
		if err != nil {
			return nil, err
		}
		cl.fence = f
	}
	for i := range cfg.Nodes {
		if err := cl.start(ctx, fmt.Sprintf("node-%d", i)); err != nil {
			cl.Close()
			return nil, err
		}
	}
	if err := cl.WaitConverged(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	if err := cl.WaitStable(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// start starts (or restarts) name and joins it to the live nodes.
func (cl *Cluster) start(ctx context.Context, name string) error {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		return coordinator.ErrClosed
	}
	var seeds []string
	for _, n := range cl.nodes {
		if !n.crashed {
			seeds = append(seeds, n.c.GossipAddr())
		}
	}
	cl.mu.Unlock()
	slices.Sort(seeds)

	tr, err := cl.net.Transport(name, faultnet.TransportConfig{})
	if err != nil {
		return err
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring.Partitions = cl.cfg.Partitions
	cfg.Seeds = seeds
	cfg.Fence = cl.fence
	cfg.Handler = coordinator.HandlerFuncs{}
	if cl.cfg.Handler != nil {
		cfg.Handler = cl.cfg.Handler(name)
	}
	if cl.cfg.Logger != nil {
		cfg.Logger = cl.cfg.Logger
	}
	clock := newPausableClock()
	cfg.Clock = clock
	ml := *cfg.Memberlist
	ml.Transport = tr
	cfg.Memberlist = &ml
	if cl.cfg.Tweak != nil {
		cl.cfg.Tweak(&cfg)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		_ = tr.Shutdown()
		clock.close()
		return err
	}
	if cl.cfg.Bind != nil {
		cl.cfg.Bind(name, c)
	}
	if err := c.Start(ctx); err != nil {
		_ = tr.Shutdown()
		clock.close()
		return fmt.Errorf("tenuretest: start %s: %w", name, err)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		c.Close()
		clock.close()
		return coordinator.ErrClosed
	}
	if old := cl.nodes[name]; old != nil {
		old.clock.close()
	} else {
		cl.order = append(cl.order, name)
	}
	cl.nodes[name] = &node{c: c, tr: tr, clock: clock}
	return nil
}

// Close closes every node (a crash, without handoff) and waits for their
// goroutines, except memberlist's probes, which end within a probe round
// after (VerifyTestMain waits for them). It is idempotent.
func (cl *Cluster) Close() {
	cl.mu.Lock()
	cl.closed = true
	nodes := make([]*node, 0, len(cl.nodes))
	for _, n := range cl.nodes {
		nodes = append(nodes, n)
	}
	cl.mu.Unlock()
	for _, n := range nodes {
		n.c.Close()
		n.clock.close()
	}
}

// Fence returns the fence every node fences with.
func (cl *Cluster) Fence() ownership.Fence { return cl.fence }

// Network returns the fault network the nodes gossip over, for faults the
// harness has no method for (one-way cuts, drops, delays).
func (cl *Cluster) Network() *faultnet.Network { return cl.net }

// Node returns the coordinator of the node called name (its latest life
// after a Restart), or nil.
func (cl *Cluster) Node(name string) *coordinator.Coordinator {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if n := cl.nodes[name]; n != nil {
		return n.c
	}
	return nil
}

// Live returns the names of the nodes that are running and not paused, in
// the order they were first started.
func (cl *Cluster) Live() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []string
	for _, name := range cl.order {
		if n := cl.nodes[name]; n != nil && !n.crashed && !n.paused {
			out = append(out, name)
		}
	}
	return out
}

func (cl *Cluster) get(name string) (*node, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := cl.nodes[name]
	if n == nil {
		return nil, fmt.Errorf("tenuretest: no node %q", name)
	}
	return n, nil
}

// Crash stops name at once, as a killed process: its leases end, gossip
// stops without a goodbye. Restart brings it back.
func (cl *Cluster) Crash(name string) error {
	n, err := cl.get(name)
	if err != nil {
		return err
	}
	cl.mu.Lock()
	n.crashed = true
	cl.mu.Unlock()
	n.c.Close()
	return nil
}

// Restart starts a crashed or departed node again under its name, with a
// new incarnation, and joins it to the live nodes. It does not wait for
// convergence.
func (cl *Cluster) Restart(ctx context.Context, name string) error {
	n, err := cl.get(name)
	if err != nil {
		return err
	}
	cl.mu.Lock()
	down := n.crashed
	cl.mu.Unlock()
	if !down {
		return fmt.Errorf("tenuretest: %s is running: Crash or Leave it first", name)
	}
	return cl.start(ctx, name)
}

// Leave makes name leave gracefully: its handlers drain and release, the
// others take its partitions over, then it stops.
func (cl *Cluster) Leave(ctx context.Context, name string) error {
	n, err := cl.get(name)
	if err != nil {
		return err
	}
	err = n.c.Leave(ctx)
	cl.mu.Lock()
	n.crashed = true
	cl.mu.Unlock()
	return err
}

// Partition cuts the network into the given groups of node names: nodes
// in different groups can't reach each other. Nodes in no group keep
// every link.
func (cl *Cluster) Partition(groups ...[]string) error { return cl.net.Partition(groups...) }

// Heal removes every cut (Partition, Pause's isolation, faults set on
// Network) except those of paused nodes, which Resume heals.
func (cl *Cluster) Heal() {
	cl.net.Heal()
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for name, n := range cl.nodes {
		if n.paused {
			cl.net.Isolate(name)
		}
	}
}

// Pause freezes name's coordinator as a stopped process's would look from
// outside and from inside: no gossip reaches it or leaves it, and its
// clock's tickers stop, so its timers (step-down among them) don't fire
// and it goes on believing in its leases. The others fail its partitions
// over; when Resume lets it go on, its writes under the old leases meet
// the fence.
//
// It freezes only that: the node's gossip and the coordinator's clock.
// The Handler's own goroutines keep running, and its connections to a
// resource (a database) stay open: a handler keeps writing under its old
// leases while paused, and those writes meet the fence as soon as a new
// owner fenced the partition. To freeze the handler too, block it from the
// test (for example in its write path), or run the node in a process of
// its own and stop it (SIGSTOP).
func (cl *Cluster) Pause(name string) error {
	n, err := cl.get(name)
	if err != nil {
		return err
	}
	cl.mu.Lock()
	n.paused = true
	cl.mu.Unlock()
	n.clock.pause()
	cl.net.Isolate(name)
	return nil
}

// Resume undoes Pause: the clock runs again and the node's links heal.
func (cl *Cluster) Resume(name string) error {
	n, err := cl.get(name)
	if err != nil {
		return err
	}
	cl.mu.Lock()
	n.paused = false
	paused := map[string]bool{}
	for other, m := range cl.nodes {
		if m.paused {
			paused[other] = true
		}
	}
	cl.mu.Unlock()
	// faultnet heals all or nothing: heal, then isolate the nodes still
	// paused again.
	cl.net.Heal()
	for other := range paused {
		cl.net.Isolate(other)
	}
	n.clock.resume()
	return nil
}

// WaitConverged waits until the named nodes (default: every live node)
// see exactly each other, share one table, and every partition is held by
// its ring owner with no lease in transit, or until ctx ends.
func (cl *Cluster) WaitConverged(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		names = cl.Live()
	}
	want := slices.Sorted(slices.Values(names))
	var why error
	err := Poll(ctx, func() bool {
		why = cl.converged(want)
		return why == nil
	})
	if err != nil {
		return fmt.Errorf("tenuretest: %v did not converge: %v; %s (%w)", want, why, cl.quorums(want), err)
	}
	return nil
}

// quorums describes what each named node counts its quorum against, for
// a wait's error: the first node that holds a wait up need not be the
// only one.
func (cl *Cluster) quorums(names []string) string {
	var parts []string
	for _, name := range names {
		c := cl.Node(name)
		if c == nil {
			continue
		}
		st := c.Status()
		parts = append(parts, fmt.Sprintf("%s: quorum %t, converged %t, stable %v, unreachable %v, unheard %v",
			name, st.Quorum, st.Converged, st.Stable, st.Unreachable, st.Unheard))
	}
	return strings.Join(parts, "; ")
}

// WaitStable waits until the stable membership of each named node
// (default: every live node), the set it counts its majority against, is
// exactly the named nodes and each has a quorum, or until ctx ends. The
// stable membership lags the members a node sees: a join usually enters
// it at once, but can take up to StableAfter or 2 x Grace (a node that
// has just started counts the members its join listed only once they
// answer), and a crash or a cut leaves it only after StableAfter, and
// only if the rest hold a majority of it. Until a join has entered it, a
// cut that leaves the named nodes a majority of the members may leave
// them no majority of the stable membership, and no quorum until the cut
// heals. With Config.MinQuorum set, quorum does not depend on it, and it
// may never shrink to the named nodes: use WaitConverged.
func (cl *Cluster) WaitStable(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		names = cl.Live()
	}
	want := slices.Sorted(slices.Values(names))
	if len(want) == 0 {
		return errors.New("tenuretest: WaitStable: no live nodes")
	}
	var why error
	err := Poll(ctx, func() bool {
		why = nil
		for _, name := range want {
			c := cl.Node(name)
			if c == nil {
				why = fmt.Errorf("no node %s", name)
				return false
			}
			st := c.Status()
			if got := slices.Sorted(slices.Values(st.Stable)); !slices.Equal(got, want) {
				why = fmt.Errorf("%s's stable membership is %v", name, got)
				return false
			}
			if !st.Quorum {
				why = fmt.Errorf("%s has no quorum", name)
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("tenuretest: %v not stable: %v; %s (%w)", want, why, cl.quorums(want), err)
	}
	return nil
}

func (cl *Cluster) converged(want []string) error {
	var fp uint64
	for i, name := range want {
		c := cl.Node(name)
		if c == nil {
			return fmt.Errorf("no node %s", name)
		}
		t := c.Table()
		if t == nil {
			return fmt.Errorf("%s has no table", name)
		}
		if got := t.Members(); !slices.Equal(got, want) {
			return fmt.Errorf("%s sees %v", name, got)
		}
		if i == 0 {
			fp = t.Fingerprint()
		} else if t.Fingerprint() != fp {
			return fmt.Errorf("%s has another table", name)
		}
		if st := c.Status(); !st.Converged {
			return fmt.Errorf("%s has partitions in transit: %s", name, inTransit(st))
		} else if !st.Quorum {
			// Leases outlive a lost quorum by StepDown: settled, but not
			// for long.
			return fmt.Errorf("%s holds its partitions without a quorum", name)
		}
	}
	return nil
}

// inTransit says why a node is not converged: the first few partitions not
// settled, and whether its loop runs late (its quorum and what it counts
// against are in quorums, which every wait's error adds).
func inTransit(st coordinator.Status) string {
	var b strings.Builder
	n := 0
	for _, p := range st.Partitions {
		if p.State == coordinator.StateSettled && (p.Owner == st.Node) == p.Local {
			continue
		}
		if n < 4 {
			fmt.Fprintf(&b, "p%d %s (ring owner %s, holder %s, epoch %d, released %t, leased here %t); ",
				p.Partition, p.State, p.Owner, p.Holder, p.Epoch, p.Released, p.Local)
		}
		n++
	}
	fmt.Fprintf(&b, "%d not settled; lag %v, late %t", n, st.Lag, st.Late)
	return b.String()
}

// OwnerOf returns the name of the node holding key's partition, once
// every live node names the same owner and that owner holds a live lease
// on it, or ctx's error.
func (cl *Cluster) OwnerOf(ctx context.Context, key []byte) (string, error) {
	var owner string
	err := Poll(ctx, func() bool {
		owner = ""
		for i, name := range cl.Live() {
			o, err := cl.Node(name).Owner(key)
			if err != nil || (i > 0 && o.Node != owner) {
				return false
			}
			owner = o.Node
		}
		c := cl.Node(owner)
		if c == nil {
			return false
		}
		_, err := c.Lease(key)
		return err == nil
	})
	if err != nil {
		return "", fmt.Errorf("tenuretest: the live nodes agree on no owner of %q: %w", key, err)
	}
	return owner, nil
}

// Poll checks cond every 10 ms until it holds, or returns ctx's error:
// the wait for a condition that tests use instead of sleeping. The error
// wraps ctx's and says how busy the machine was and how late the polling
// ran, so an overloaded machine shows as one. Give ctx a deadline from
// WithTimeout, which scales with the machine's load.
func Poll(ctx context.Context, cond func() bool) error { return testkit.Poll(ctx, cond) }

// WaitFor is Poll for a test: it waits until cond holds and fails t with
// what ("waiting for <what>: context deadline exceeded (machine: ...)") if
// ctx ends first. Bound ctx with a deadline (WithTimeout); like t.Fatalf,
// call it only from the test's goroutine.
func WaitFor(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(ctx, t, what, cond)
}

// WithTimeout is context.WithTimeout with d, the bound on an idle machine,
// multiplied by SlowFactor: the deadline for a wait on a cluster.
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return slowtest.WithTimeout(parent, d)
}

// SlowFactor is how many times longer than on an idle machine a wait may
// take now: the environment variable TENURE_SLOW if set (a number, at
// least 1), else the 1-minute load average per CPU, from 1 to 8.
func SlowFactor() float64 { return slowtest.Factor() }
