package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ring"
)

// Config is one simulated cluster. Times are in ticks; every node's
// machine ticks once per tick (less or more under clock skew).
type Config struct {
	Seed       uint64
	Nodes      int // 2 to 9; in the scale mode, to MaxScaleNodes
	Partitions int
	// Strict uses a compare-and-swap authority (like the SQL one: a claim
	// is also a fence) instead of each node's gossip authority.
	Strict bool
	// Keys signs tokens and gossip; the adversary's forgeries then fail.
	Keys bool

	Grace, Handoff, StepDown, StableAfter int
	Retry, MaxRetry, Acquire, Release     int
	// Show: a node's metadata shows a new stable membership at most once
	// per Show ticks (machine.MachineConfig.ShowTicks).
	Show int
	// DetectMin and DetectMax bound how long a node takes to notice that
	// another became unreachable (the spread across observers is what
	// quorum and grace must cover); JoinDelay, that one became reachable.
	DetectMin, DetectMax, JoinDelay int
	// ReachSpan is how long a node's reach check (internal/reach, the
	// coordinator's policy: a round of pings every tick) must see a member
	// miss before it counts it unreachable (0: no reach check), and
	// ReachHold how long it does while memberlist still lists the member.
	ReachSpan, ReachHold int
	// GossipDelay bounds the delay of a broadcast; PushPull is the period
	// of full state exchanges.
	GossipDelay, PushPull int

	// Scale runs the cost model's mode (scale.go): large clusters,
	// memberlist's gossip queues, messages counted.
	Scale bool

	// Knobs re-introduce core defects (negative controls).
	Knobs machine.TestingKnobs
	// Bugs re-introduce shell defects the simulator models.
	Bugs Bugs
}

// Bugs are defects of a shell, re-introduced for negative controls.
type Bugs struct {
	// TrustGossip accepts gossip without checking its cluster, its MAC or
	// how far it moves an epoch.
	TrustGossip bool
	// ReuseIncarnation restarts a node with the incarnation of its
	// previous life (a seeded Config.Rand).
	ReuseIncarnation bool
	// NoFenceAtResource makes the resource apply every write (S1's control).
	NoFenceAtResource bool
	// AnyKindAsState makes push/pull state open messages of any kind, as
	// MergeRemoteState did before issue 19 (a claim or stable membership
	// has no register: the node crashes). The adversary's replays send
	// broadcasts as state.
	AnyKindAsState bool
	// ClaimIgnoresMark makes the strict authority grant the epoch after
	// the claimant's seen token without comparing it with the mark (S4's
	// control: the check holds by construction otherwise).
	ClaimIgnoresMark bool
	// GracefulByFlag counts a member dropped while its metadata said
	// Leaving as a graceful leave, goodbye heard or not (issue 19, defect
	// 4: a leave during a split gave both sides a quorum).
	GracefulByFlag bool
	// ReachAllMembers makes the reach check ping every member each round
	// and ignore the node's own lateness, as the first version did (issues
	// 20 and 22: the reach storm).
	ReachAllMembers bool
	// ReachIgnoresLag makes the reach check ping, and count its rounds,
	// while the node is late.
	ReachIgnoresLag bool
}

// DefaultConfig returns timings in the proportions of the local preset.
func DefaultConfig(seed uint64) Config {
	return Config{
		Seed: seed, Nodes: 5, Partitions: 16,
		Grace: 12, Handoff: 10, StepDown: 3, StableAfter: 25,
		Retry: 2, MaxRetry: 16, Acquire: 12, Release: 12, Show: 6,
		DetectMin: 2, DetectMax: 6, JoinDelay: 3, ReachSpan: 2, ReachHold: 24,
		GossipDelay: 2, PushPull: 10,
	}
}

// event is one thing that happens at a tick.
type event struct {
	at  uint64
	seq uint64
	fn  func()
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Sim is one simulated cluster.
type Sim struct {
	cfg  Config
	rng  *rand.Rand
	now  uint64
	q    queue
	seq  uint64
	keys *ownership.Keyring

	nodes  []*node
	byName map[string]*node
	net    *network
	scale  *scaleState // the scale mode's, or nil
	res    *resource
	chk    *checker
	rings  map[string]*ring.Table // tables by member set
	ringC  ring.Config

	// Events counts the inputs fed to machines and the messages delivered.
	Events uint64
	trace  *strings.Builder // when set, a line per notable event
	incs   uint64
	faults []string
	// MaxEpisodeEpochs is the most epochs one partition took in one
	// episode.
	MaxEpisodeEpochs int
	epoch            int  // episodes begun
	faultGen         int  // faults and heals applied
	healed           bool // the current episode's faults are over
}

// New builds a cluster of cfg.Nodes nodes that found it together: node 0
// bootstraps, the others join it.
func New(cfg Config) (*Sim, error) {
	most := 9
	if cfg.Scale {
		most = MaxScaleNodes
	}
	if cfg.Nodes < 2 || cfg.Nodes > most || cfg.Partitions < 1 {
		return nil, fmt.Errorf("sim: %d nodes, %d partitions", cfg.Nodes, cfg.Partitions)
	}
	s := &Sim{
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		rings:  make(map[string]*ring.Table),
		byName: make(map[string]*node),
		ringC:  ring.Config{Partitions: cfg.Partitions, VirtualNodes: 20, Load: 1.25},
	}
	if cfg.Keys {
		k, err := ownership.NewKeyring([]byte("tenure simulated cluster key 32b"))
		if err != nil {
			return nil, err
		}
		s.keys = k
	}
	if cfg.Scale {
		s.scale = newScale(s)
	}
	s.res = newResource(s)
	s.chk = newChecker(s)
	s.net = newNetwork(s, cfg.Nodes)
	for i := range cfg.Nodes {
		s.nodes = append(s.nodes, &node{s: s, idx: i, name: fmt.Sprintf("n%d", i)})
		s.byName[s.nodes[i].name] = s.nodes[i]
	}
	for i, n := range s.nodes {
		n.start(i == 0)
	}
	s.net.refreshAll()
	return s, nil
}

// Trace makes the simulator log notable events into b.
func (s *Sim) Trace(b *strings.Builder) { s.trace = b }

func (s *Sim) tracef(format string, args ...any) {
	if s.trace != nil {
		fmt.Fprintf(s.trace, "t=%d ", s.now)
		fmt.Fprintf(s.trace, format, args...)
		s.trace.WriteByte('\n')
	}
}

// after schedules fn d ticks from now (d 0: later this tick).
func (s *Sim) after(d int, fn func()) {
	s.seq++
	heap.Push(&s.q, event{at: s.now + uint64(max(d, 0)), seq: s.seq, fn: fn})
}

// between returns a random int in [lo, hi].
func (s *Sim) between(lo, hi int) int {
	if hi <= lo {
		return lo
	}
	return lo + s.rng.IntN(hi-lo+1)
}

// chance reports true with probability p.
func (s *Sim) chance(p float64) bool { return s.rng.Float64() < p }

// Step runs one tick: the events due, then every node's tick.
func (s *Sim) Step() {
	for len(s.q) > 0 && s.q[0].at <= s.now {
		e := heap.Pop(&s.q).(event)
		e.fn()
	}
	s.net.step()
	for _, n := range s.nodes {
		n.tick()
	}
	s.chk.step()
	if s.scale != nil {
		s.scale.cost.Ticks++
	}
	s.now++
}

// Run runs n ticks.
func (s *Sim) Run(n int) {
	for range n {
		s.Step()
	}
}

// Now returns the simulated time in ticks.
func (s *Sim) Now() uint64 { return s.now }

// SplitBrains counts the times two sides of a lasting split both served.
func (s *Sim) SplitBrains() int { return s.chk.SplitBrains }

// Violations returns what the checks found, in order.
func (s *Sim) Violations() []string { return s.chk.violations }

// table returns the ring table of a member set (cached: tables are a
// function of the set).
func (s *Sim) table(members []string) *ring.Table {
	k := strings.Join(members, ",")
	if t, ok := s.rings[k]; ok {
		return t
	}
	t, err := ring.New(members, s.ringC)
	if err != nil {
		panic(err) // the simulator builds only valid sets
	}
	s.rings[k] = t
	return t
}

// incarnation returns a new incarnation, unique in the run.
func (s *Sim) incarnation() uint64 {
	s.incs++
	return s.incs<<8 | 1
}

// Node returns node i's name.
func (s *Sim) Node(i int) string { return s.nodes[i].name }

// nodeByName returns the node named name, or nil.
func (s *Sim) nodeByName(name string) *node { return s.byName[name] }

// Converged reports whether every running node agrees on one view, every
// partition is served by its ring owner in that view under the resource's
// mark, and nothing is in transit; if not, why not.
func (s *Sim) Converged() (bool, string) {
	var ref []string
	var running []*node
	for _, n := range s.nodes {
		if !n.running() {
			continue
		}
		running = append(running, n)
		v := n.placed()
		if ref == nil {
			ref = v
		} else if !slices.Equal(ref, v) {
			return false, fmt.Sprintf("%s places on %v, %s on %v", running[0].name, ref, n.name, v)
		}
	}
	if len(running) == 0 {
		return false, "no node runs"
	}
	for _, n := range running {
		if !n.m.Quorum() {
			return false, n.name + " has no quorum"
		}
	}
	t := s.table(ref)
	for p := range uint32(s.cfg.Partitions) {
		owner := s.nodeByName(t.Owner(p))
		if owner == nil || !owner.running() {
			return false, fmt.Sprintf("p%d: ring owner %s is not running", p, t.Owner(p))
		}
		ph, tok := owner.m.Phase(p)
		if ph != machine.Owned || !owner.served(p) {
			return false, fmt.Sprintf("p%d: ring owner %s is %v", p, owner.name, ph)
		}
		if mark := s.res.mark(p); !mark.Same(tok) {
			return false, fmt.Sprintf("p%d: %s holds %v, the resource's mark is %v", p, owner.name, tok, mark)
		}
		for _, n := range running {
			if n != owner {
				if ph, _ := n.m.Phase(p); ph != machine.Unowned {
					return false, fmt.Sprintf("p%d: %s is %v too", p, n.name, ph)
				}
			}
		}
	}
	return true, ""
}
