package coordinator

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// The reach check must not turn what memberlist tolerates into a lasting
// loss of quorum. Found by review: the first version counted any member
// that missed three direct pings as unreachable for as long as it missed
// them, whatever memberlist's own (indirect, TCP) probes said.

// A node that reaches one member directly and the others only through it:
// memberlist keeps everyone alive with indirect probes. After a burst of
// loss raised the node's health score, it marked the three it can't ping
// unreachable and never counted a quorum again; nobody else claimed its
// partitions either (it is alive in every view), so they stayed unowned.
func TestPartialConnectivityKeepsQuorum(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tc, fn := faultCluster(t, nil)
	tc.startNodes(ctx, "r", 5)
	for _, o := range []string{"r1", "r2", "r3"} {
		fn.Cut("r4", o)
		fn.Cut(o, "r4")
	}
	burst(t, fn)
	// Once memberlist's probes get through again (its health score falls
	// back to zero), or reachHold after the misses counted, r4 counts a
	// quorum again and holds partitions, and keeps doing so for longer
	// than a miss takes to count. (Memberlist itself flaps in this
	// topology: nodes drop a member now and then and see it rejoin, so
	// the cluster converges only now and then, with the reach check or
	// without.)
	settle, done := context.WithTimeout(ctx, 30*time.Second)
	defer done()
	r4 := tc.node("r4").c
	var heldSince time.Time
	for hold := reachSpan(r4.Config()) + time.Second; heldSince.IsZero() || time.Since(heldSince) < hold; {
		st := r4.Status()
		switch ok := st.Quorum && st.Owned > 0; {
		case ok && heldSince.IsZero():
			heldSince = time.Now()
		case !ok:
			heldSince = time.Time{}
		}
		select {
		case <-settle.Done():
			t.Fatalf("r4: quorum %v, owns %d, unreachable %v", st.Quorum, st.Owned, st.Unreachable)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A member that gets no UDP (memberlist falls back to TCP for it), then a
// crash: the first version's survivors never promoted the stable set over
// the crashed member, because promotion counts the members reached and the
// deaf one never answers a ping. Every partition stayed unowned.
func TestUDPDeafMemberThenACrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	fn := faultnet.New(faultnet.WithSeed(2))
	var deafened *deafTransport
	tc := newTestCluster(t, func(c *Config) {
		tr, err := fn.Transport(c.Name, faultnet.TransportConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var mt memberlist.NodeAwareTransport = tr
		if c.Name == "u2" {
			deafened = newDeafTransport(tr)
			mt = deafened
		}
		ml := *c.Memberlist
		ml.Transport = mt
		c.Memberlist = &ml
	})
	tc.startNodes(ctx, "u", 3)
	deafened.deaf.Store(true)
	burst(t, fn)
	tc.remove("u1").c.Close()
	tc.waitConverged(ctx)
}

// burst drops half of all packets for 1.5 s: enough to raise every
// node's health score.
func burst(t *testing.T, fn *faultnet.Network) {
	t.Helper()
	if err := fn.Drop(0.5); err != nil {
		t.Fatal(err)
	}
	<-time.After(1500 * time.Millisecond) // the fault's length, not a wait for a condition
	if err := fn.Drop(0); err != nil {
		t.Fatal(err)
	}
}

// deafTransport drops every packet its node receives while deaf; streams
// (memberlist's TCP fallback and push/pull) still work.
type deafTransport struct {
	*faultnet.Transport
	deaf atomic.Bool
	ch   chan *memberlist.Packet
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func newDeafTransport(tr *faultnet.Transport) *deafTransport {
	d := &deafTransport{Transport: tr, ch: make(chan *memberlist.Packet), done: make(chan struct{})}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			select {
			case p := <-tr.PacketCh():
				if d.deaf.Load() {
					continue
				}
				select {
				case d.ch <- p:
				case <-d.done:
					return
				}
			case <-d.done:
				return
			}
		}
	}()
	return d
}

func (d *deafTransport) PacketCh() <-chan *memberlist.Packet { return d.ch }

func (d *deafTransport) Shutdown() error {
	err := d.Transport.Shutdown()
	d.once.Do(func() { close(d.done) })
	d.wg.Wait()
	return err
}

// The rule the reach check counts by, on a stopped clock: a member counts
// as unreachable only while memberlist reports trouble, after reachMisses
// checks and reachSpan of misses, and for reachHold at most.
func TestReachRule(t *testing.T) {
	cfg := LocalConfig()
	clk := &stepClock{now: time.Unix(1000, 0)}
	cfg.Clock = clk
	cfg.Name, cfg.Rand = "self", rand.New(rand.NewPCG(1, 2))
	health := 1
	l := newLoop(&Coordinator{cfg: cfg}, nil)
	l.health = func() int { return health }
	span, hold := reachSpan(cfg), reachHold(cfg)
	if span != 1500*time.Millisecond || hold != 5*time.Second {
		t.Fatalf("local preset: span %v, hold %v; want 1.5s, 5s (TIMING.md says so)", span, hold)
	}
	members := map[string]ownership.Member{"self": {Name: "self"}}
	for _, n := range []string{"a", "b", "c", "d"} {
		members[n] = ownership.Member{Name: n, Incarnation: 7}
	}
	// Rounds every ProbeInterval: c and d answer every one, b none, a
	// only the fourth-last, so it has missed just two in a row at span.
	start := clk.now
	interval := cfg.Memberlist.ProbeInterval
	for at := time.Duration(0); at <= span; at += interval {
		clk.now = start.Add(at)
		due := l.reach.Due(clk.now, true, l.reachMembers(members))
		if len(due) != 4 {
			t.Fatalf("round at %v pings %d members, want all 4 of a 5-member view", at, len(due))
		}
		res := reachResult{"a": at+3*interval > span && at+2*interval <= span, "b": false, "c": true, "d": true}
		l.reach.Done(clk.now, clk.now.Add(cfg.Memberlist.ProbeTimeout), res, l.reachMembers(members))
	}
	for _, c := range []struct {
		after  time.Duration
		health int
		want   []string
	}{
		{span - time.Millisecond, 1, nil},
		{span, 1, []string{"b"}}, // a missed only two checks
		{span, 0, nil},           // no trouble: memberlist decides
		{span + hold - time.Millisecond, 3, []string{"b"}},
		{span + hold, 3, nil}, // held long enough: counted again
	} {
		clk.now, health = start.Add(c.after), c.health
		if got, _ := l.verdicts(l.reachMembers(members)); !slices.Equal(got, c.want) {
			t.Errorf("%v after the first miss, health %d: unreachable %v, want %v", c.after, c.health, got, c.want)
		}
	}
}

// stepClock is a Clock that moves only when told.
type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }
func (c *stepClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	return make(chan time.Time), func() {}
}
