package faultnet

import (
	"bytes"
	"fmt"
	"log"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/internal/testkit"
)

const (
	// clusterTimeout bounds every wait for a membership change.
	clusterTimeout = 15 * time.Second

	// rejoinEvery is how often waitViews re-joins nodes that should see
	// each other but don't, as a coordinator's periodic rejoin does.
	rejoinEvery = 500 * time.Millisecond
)

// fastConfig is memberlist.DefaultLocalConfig with timings short enough for
// failure detection within a second or two on loopback, yet loose enough to
// survive a loaded machine running the race detector.
func fastConfig(name string, tr *Transport, logs *syncBuffer) *memberlist.Config {
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.Transport = tr
	c.BindAddr = "127.0.0.1"
	c.BindPort = tr.Port()
	c.AdvertisePort = tr.Port()
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 2
	c.PushPullInterval = 2 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.Logger = log.New(logs, name+" ", log.Lmicroseconds)
	return c
}

// syncBuffer collects the cluster's memberlist logs, shown when a test fails.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// seenNodes records copies of the nodes memberlist reports to a delegate.
// memberlist.Members returns pointers into memberlist's own state, whose
// fields (other than Name) race with its updates; the join and conflict
// delegates run under memberlist's lock, so a copy taken there is safe.
type seenNodes struct {
	mu    sync.Mutex
	nodes []memberlist.Node
}

func (s *seenNodes) add(n *memberlist.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes = append(s.nodes, *n)
}

func (s *seenNodes) seen(name string, port uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		if n.Name == name && n.Port == port {
			return true
		}
	}
	return false
}

// conflicts records the newcomer of each conflicting-address notification.
type conflicts struct{ seenNodes }

func (c *conflicts) NotifyConflict(_, other *memberlist.Node) { c.add(other) }

// joins records memberlist's join events.
type joins struct{ seenNodes }

func (j *joins) NotifyJoin(n *memberlist.Node) { j.add(n) }
func (j *joins) NotifyLeave(*memberlist.Node)  {}
func (j *joins) NotifyUpdate(*memberlist.Node) {}

type node struct {
	name      string
	tr        *Transport
	ml        *memberlist.Memberlist
	conflicts *conflicts
	joins     *joins
}

type cluster struct {
	t    *testing.T
	net  *Network
	logs *syncBuffer
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, net: New(), logs: &syncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("memberlist logs:\n%s", c.logs)
		}
	})
	return c
}

// start creates a node; tweak, if not nil, adjusts its config.
func (c *cluster) start(name string, tweak func(*memberlist.Config)) *node {
	c.t.Helper()
	tr, err := c.net.Transport(name, TransportConfig{})
	if err != nil {
		c.t.Fatal(err)
	}
	n := &node{name: name, tr: tr, conflicts: &conflicts{}, joins: &joins{}}
	conf := fastConfig(name, tr, c.logs)
	conf.Conflict = n.conflicts
	conf.Events = n.joins
	if tweak != nil {
		tweak(conf)
	}
	n.ml, err = memberlist.Create(conf)
	if err != nil {
		_ = tr.Shutdown()
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = n.ml.Shutdown() })
	return n
}

// join joins n to other, retrying until clusterTimeout: under heavy load
// a TCP dial on loopback can miss memberlist's TCPTimeout.
func (n *node) join(t *testing.T, other *node) {
	t.Helper()
	var err error
	testkit.WaitFor(testkit.Ctx(t, clusterTimeout), t, fmt.Sprintf("%s to join %s", n.name, other.name), func() bool {
		_, err = n.ml.Join([]string{other.tr.Addr()})
		return err == nil
	})
}

// view is the sorted names of the members n considers alive or suspect.
// It reads only Name, the one field of a member memberlist never changes.
func (n *node) view() []string {
	var names []string
	for _, m := range n.ml.Members() {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

// waitViews waits until each of nodes sees exactly nodes. A node missing a
// peer it should see re-joins it every rejoinEvery (errors ignored), the way
// a coordinator rejoins known members: on a starved machine memberlist can
// declare a reachable peer dead, and it never probes a dead node again.
// Joins across a fault are refused, so re-joining can't hide a fault.
func waitViews(t *testing.T, nodes ...*node) {
	t.Helper()
	var want []string
	for _, n := range nodes {
		want = append(want, n.name)
	}
	slices.Sort(want)
	lastRejoin := time.Now()
	testkit.WaitFor(testkit.Ctx(t, clusterTimeout), t, fmt.Sprintf("views %v", want), func() bool {
		settled := true
		for _, n := range nodes {
			if !slices.Equal(n.view(), want) {
				settled = false
			}
		}
		if settled || time.Since(lastRejoin) < rejoinEvery {
			return settled
		}
		lastRejoin = time.Now()
		for _, n := range nodes {
			view := n.view()
			for _, peer := range nodes {
				if !slices.Contains(view, peer.name) {
					_, _ = n.ml.Join([]string{peer.tr.Addr()})
				}
			}
		}
		return false
	})
}

func TestClusterPartitionAndHeal(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", nil), c.start("b", nil)
	cc, d := c.start("c", nil), c.start("d", nil)
	for _, n := range []*node{b, cc, d} {
		n.join(t, a)
	}
	waitViews(t, a, b, cc, d)

	if err := c.net.Partition([]string{"a", "b"}, []string{"c", "d"}); err != nil {
		t.Fatal(err)
	}
	waitViews(t, a, b)
	waitViews(t, cc, d)

	// While partitioned a join across the partition is refused at once.
	if _, err := a.ml.Join([]string{cc.tr.Addr()}); err == nil {
		t.Fatal("join across a partition succeeded")
	}

	c.net.Heal()
	a.join(t, cc)
	waitViews(t, a, b, cc, d)
}

func TestClusterRestartOnNewAddress(t *testing.T) {
	c := newCluster(t)
	// a accepts a dead node back on a new address; b doesn't, and keeps the
	// dead node long enough not to forget it during the test.
	a := c.start("a", func(conf *memberlist.Config) { conf.DeadNodeReclaimTime = time.Millisecond })
	b := c.start("b", func(conf *memberlist.Config) { conf.GossipToTheDeadTime = time.Minute })
	old := c.start("c", nil)
	b.join(t, a)
	old.join(t, a)
	waitViews(t, a, b, old)

	// Crash c and wait until the others declare it dead.
	if err := old.ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	waitViews(t, a, b)

	restarted := c.start("c", nil)
	if restarted.tr.Port() == old.tr.Port() {
		t.Fatalf("restart reused port %d", old.tr.Port())
	}
	if got, _ := c.net.Addr("c"); got != restarted.tr.Addr() {
		t.Fatalf("network maps c to %s, want %s", got, restarted.tr.Addr())
	}
	restarted.join(t, a)

	port := uint16(restarted.tr.Port())
	testkit.WaitFor(testkit.Ctx(t, clusterTimeout), t, "a to accept c on its new address", func() bool {
		return a.joins.seen("c", port) && slices.Contains(a.view(), "c")
	})
	// b, without DeadNodeReclaimTime, refuses the new address.
	testkit.WaitFor(testkit.Ctx(t, clusterTimeout), t, "b to report c's new address as a conflict", func() bool {
		return b.conflicts.seen("c", port)
	})
	if b.joins.seen("c", port) {
		t.Fatal("b accepted c on a conflicting address")
	}
	if a.conflicts.seen("c", port) {
		t.Fatal("a reported a conflict despite DeadNodeReclaimTime")
	}
}

func TestClusterShutdownFreesGoroutines(t *testing.T) {
	// Also checked for every test by TestMain; here a whole cluster is torn
	// down mid-traffic, with a delay holding packets in flight.
	c := newCluster(t)
	a, b, cc := c.start("a", nil), c.start("b", nil), c.start("c", nil)
	b.join(t, a)
	cc.join(t, a)
	waitViews(t, a, b, cc)
	if err := c.net.Delay(30 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{a, b, cc} {
		if err := n.ml.Shutdown(); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.net.Addr(n.name); ok {
			t.Fatalf("%s still has an address after shutdown", n.name)
		}
	}
}

// TestFigures prints failure-detection figures for fastConfig on loopback
// with 3 nodes: join, a [a b] | [c] partition, and heal plus re-join.
func TestFigures(t *testing.T) {
	c := newCluster(t)
	start := time.Now()
	a, b, cc := c.start("a", nil), c.start("b", nil), c.start("c", nil)
	b.join(t, a)
	cc.join(t, a)
	waitViews(t, a, b, cc)
	converge := time.Since(start)

	start = time.Now()
	if err := c.net.Partition([]string{"a", "b"}, []string{"c"}); err != nil {
		t.Fatal(err)
	}
	waitViews(t, a, b)
	majority := time.Since(start)
	waitViews(t, cc)
	minority := time.Since(start)

	start = time.Now()
	c.net.Heal()
	a.join(t, cc)
	waitViews(t, a, b, cc)
	merge := time.Since(start)

	sent, dropped := c.net.Stats()
	fmt.Printf("figure: faultnet.converge.seconds %.3f\n", converge.Seconds())
	fmt.Printf("figure: faultnet.detect_majority.seconds %.3f\n", majority.Seconds())
	fmt.Printf("figure: faultnet.detect_minority.seconds %.3f\n", minority.Seconds())
	fmt.Printf("figure: faultnet.merge.seconds %.3f\n", merge.Seconds())
	fmt.Printf("figure: faultnet.packets_sent %d\n", sent)
	fmt.Printf("figure: faultnet.packets_dropped %d\n", dropped)

	// Targets for fastConfig (ProbeInterval 200ms, suspicion 0.6-1.2s),
	// with room for a loaded machine.
	for _, f := range []struct {
		name       string
		got, limit time.Duration
	}{
		{"converge", converge, 5 * time.Second},
		{"detect_minority", minority, 8 * time.Second},
		{"merge", merge, 5 * time.Second},
	} {
		if f.got > f.limit {
			t.Errorf("%s took %v, target %v", f.name, f.got, f.limit)
		}
	}
	if dropped == 0 || dropped >= sent {
		t.Errorf("partition dropped %d of %d packets", dropped, sent)
	}
}
