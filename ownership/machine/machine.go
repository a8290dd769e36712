package machine

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// Placement is what the state machine needs from a partition table: which
// member the ring assigns each partition to. *ring.Table satisfies it.
type Placement interface {
	Partitions() int
	Owner(partition uint32) string
	// Fingerprint identifies the member set and configuration: equal
	// placements have equal fingerprints, and two placements with equal
	// fingerprints place every partition alike (the machine keeps what it
	// derived from a placement while the fingerprint stays).
	Fingerprint() uint64
}

// A View is one node's view of the membership: who it sees, and where the
// ring places partitions among them.
type View struct {
	// Members are the live members, this node included, leaving ones too.
	Members []ViewMember
	// Placement is the ring over the members that are not leaving. Nil
	// while there is none (every member is leaving).
	Placement Placement
	// Left names members that left gracefully since the previous view:
	// this node heard their goodbye, for their current life, before they
	// went. A member that went without one (a crash, or a leaver whose
	// goodbye a split cut off) is not in Left, even if it was Leaving.
	Left []string
}

// Phase is where one partition stands on this node.
type Phase uint8

// The phases of a partition, in the order a grant goes through them.
const (
	Unowned   Phase = iota // not held here
	Claiming               // waiting for the authority to mint a token
	Fencing                // token minted; the resource is being fenced with it
	Acquiring              // fenced; the handler's Acquire is running
	Owned                  // serving
	Releasing              // the handler is draining before the release is published
)

var phaseNames = [...]string{"unowned", "claiming", "fencing", "acquiring", "owned", "releasing"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// ActionKind says what the shell must do for an Action.
type ActionKind uint8

const (
	// ActClaim: ask the Authority for a token for Partition strictly above
	// Token (zero if none is known), then feed the answer to Claimed.
	ActClaim ActionKind = iota + 1
	// ActFence: start the lease of Token if it has not started (its context
	// live, not yet served) and fence the resource with Token; feed the
	// outcome to Fenced.
	ActFence
	// ActAcquire: start the lease of Token if it has not started, and call
	// the handler's Acquire for it; feed the outcome to Acquired.
	ActAcquire
	// ActServe: the lease of Token is fenced and acquired: callers may have
	// it from now on. Waited is how many ticks passed since the ring gave
	// the partition to this node; Failover says whether the previous holder
	// vanished without a release (a failover) rather than handing off.
	ActServe
	// ActRelease: call the handler's Release for the lease of Token, and
	// feed Released when it returns. With a nil Cause it is a planned
	// release: the lease is live, callers no longer get it, and the handler
	// drains. With a Cause the lease has already ended (Cause says why) and
	// the handler only cleans up.
	ActRelease
	// ActEnd: end the lease of Token now, with Cause (which wraps
	// ErrLeaseEnded): cancel its context and stop giving it to callers. Its
	// writes may already be rejected by the resource.
	ActEnd
	// ActPublish: gossip the claim (Token, Released) to the other nodes.
	// The machine has recorded it in its register already (New says
	// whether that changed the register).
	ActPublish
	// ActStable: the stable membership changed to Stable: keep it for
	// gossip (push/pull state) and broadcast it. Node metadata shows it
	// when ActShow says.
	ActStable
	// ActSync: member Node holds a newer stable membership: ask it for it
	// (the coordinator sends a stable ask first, then, from the Tries it
	// escalates at, or with no stable membership of its own, exchanges
	// its whole state with Node by a push/pull). One member is asked per newer stable
	// membership at a time; another after RetryTicks (doubling) if this
	// node is still behind. The first ask waits RetryTicks when a member
	// that showed this node's own stable membership, or an older one,
	// steps past it (a join: the new set's gossip is on its way).
	ActSync
	// ActQuorum: whether this node sees a quorum changed to OK. For logs
	// and status; the machine has acted on it already.
	ActQuorum
	// ActShow: show Stable's ID in this node's metadata (ViewMember.Stable
	// on the other nodes). The first stable membership is shown at once,
	// later ones at most once per ShowTicks (MachineConfig.ShowTicks).
	ActShow
)

var actNames = [...]string{"", "claim", "fence", "acquire", "serve", "release", "end", "publish", "stable", "sync", "quorum", "show"}

func (k ActionKind) String() string {
	if int(k) < len(actNames) && k != 0 {
		return actNames[k]
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// An Action is one thing the shell must do. The shell performs a batch of
// actions in order.
type Action struct {
	Kind      ActionKind
	Partition uint32
	// Token: for ActClaim, the token to mint above (zero if none);
	// otherwise the lease's token.
	Token ownership.Token
	// Released: for ActPublish, whether the claim is a release.
	Released bool
	// New: for ActPublish, whether the claim changed the register (it
	// was not there already: a gossip authority records the tokens it
	// mints as it mints them).
	New bool
	// Cause: for ActEnd, why the lease ends; for ActRelease, nil for a
	// planned release and otherwise why the lease already ended.
	Cause error
	// Waited and Failover: for ActServe (see there).
	Waited   uint64
	Failover bool
	// Stable: for ActStable and ActShow.
	Stable quorum.Stable
	// Node: for ActSync.
	Node string
	// Tries: for ActSync, how many asks for the same stable membership
	// went before this one (to other members, or to Node before the
	// retry wait).
	Tries int
	// OK: for ActQuorum.
	OK bool
}

func (a Action) String() string {
	var b strings.Builder
	b.WriteString(a.Kind.String())
	switch a.Kind {
	case ActStable, ActShow:
		fmt.Fprintf(&b, " %v", a.Stable)
		return b.String()
	case ActSync:
		fmt.Fprintf(&b, " %s", a.Node)
		return b.String()
	case ActQuorum:
		fmt.Fprintf(&b, " %v", a.OK)
		return b.String()
	}
	fmt.Fprintf(&b, " p%d %s", a.Partition, tokenShort(a.Token))
	if a.Released {
		b.WriteString(" released")
	}
	if a.Cause != nil {
		fmt.Fprintf(&b, " (%s)", strings.TrimPrefix(a.Cause.Error(), ownership.ErrLeaseEnded.Error()+": "))
	}
	if a.Kind == ActServe {
		fmt.Fprintf(&b, " waited=%d", a.Waited)
		if a.Failover {
			b.WriteString(" failover")
		}
	}
	return b.String()
}

func tokenShort(t ownership.Token) string {
	if t.IsZero() {
		return "none"
	}
	return fmt.Sprintf("e%d/%s:%d", t.Epoch, t.Owner, t.Incarnation)
}

// LeaverWaitFactor is how many times HandoffTicks a new owner waits for a
// live holder that is leaving: its drain, timed on its own clock, may run
// that many times slower than the new owner's ticks before it is fenced.
const LeaverWaitFactor = 4

// MachineConfig configures a Machine. Durations are in ticks of logical
// time: the shell calls Tick at a fixed interval and chooses it. A zero
// count means zero ticks (no wait).
type MachineConfig struct {
	// Self is this node. Required.
	Self ownership.Node
	// Partitions is the number of partitions; it must equal the
	// placement's. Required.
	Partitions int
	// Bootstrap: this node founds a cluster, so its stable membership
	// starts as itself. A node that does not bootstrap has no quorum until
	// it learns the cluster's stable membership from a member (or, when
	// every member it sees is as new as itself, until its view stays
	// unchanged for StableAfterTicks: a whole cluster starting at once).
	Bootstrap bool
	// MinQuorum, when > 0, replaces the majority rule: the node has a
	// quorum when it sees at least MinQuorum members, itself included.
	MinQuorum int
	// Fenced: the shell has a resource to fence with every new token
	// before the handler's Acquire (ActFence). Without it tokens go straight
	// to ActAcquire and the handler fences.
	Fenced bool
	// StrictAuthority: the authority issues epochs strictly (S4). A token
	// it mints is then the partition's truth even below a claim gossip has
	// shown, and after a conflict the next claim goes above the authority's
	// answer rather than above gossip's.
	StrictAuthority bool
	// GraceTicks is how long to wait before claiming a partition whose
	// holder left the membership without publishing a release (a crash or a
	// partition). Safety does not depend on it.
	GraceTicks int
	// HandoffTicks is how long to wait for a live holder to release a
	// partition the ring has moved here before claiming it anyway (the
	// holder is then fenced). A live holder that is leaving is waited for
	// LeaverWaitFactor times as long, unless it releases or leaves the
	// view first (then GraceTicks applies).
	HandoffTicks int
	// StepDownTicks: after this many consecutive ticks without a quorum,
	// every lease ends (L4).
	StepDownTicks int
	// StableAfterTicks: a view unchanged this long, holding a quorum of the
	// stable membership, becomes the stable membership.
	StableAfterTicks int
	// ShowTicks: the stable membership this node shows in its metadata
	// (ActShow) changes at most once per ShowTicks. Each show is an update
	// of the node's metadata, which gossip carries to every member, and
	// each join changes every node's stable membership: when nodes start
	// one after another, a burst of changes is shown as its latest. The
	// first stable membership is shown at once (a member that shows none
	// counts as a new process), and so is a change after ShowTicks
	// without one. A node learns late, by at most ShowTicks, that a
	// member holds a newer stable membership than its own (it is then
	// outdated). At most StableAfterTicks/2, so that a promotion (a view
	// unchanged for StableAfterTicks) is always shown at once. Zero: every
	// change at once.
	ShowTicks int
	// RetryTicks is the first wait after a failed claim, fence or acquire,
	// or a resignation; it doubles with each failure in a row, up to
	// MaxRetryTicks (default 32 x RetryTicks), with jitter from Rand.
	// It is also the first wait (at least a tick, no jitter) before an
	// outdated node asks another member for a newer stable membership
	// (ActSync) when the first asked did not bring it up to date.
	RetryTicks    int
	MaxRetryTicks int
	// AcquireTicks and ReleaseTicks bound the handler's calls: past them
	// the lease ends as if the call had failed (Acquire) or returned
	// (Release). Zero: no bound.
	AcquireTicks int
	ReleaseTicks int
	// MaxClaims bounds the claims in flight at once (ActClaim not yet
	// answered), so a node that is given hundreds of partitions at once
	// doesn't send them all to its authority at the same instant; the rest
	// wait for later ticks. Zero: no bound.
	MaxClaims int
	// Rand draws the backoff jitter. Nil: no jitter.
	Rand *rand.Rand
	// Register is the record of claims the machine keeps: every claim it
	// hears (Heard) or publishes (ActPublish) is recorded in it before the
	// shell learns of it. It is safe for concurrent use, so the shell's
	// gossip may read it (push/pull state) from other goroutines, and a
	// gossip authority (gossip.NewAuthority) may mint into it; nothing else
	// writes to it. Its partition count must be Partitions. Nil: the
	// machine makes its own (see Machine.Register).
	Register *gossip.Register
	// Knobs are for tenure's own tests (see TestingKnobs). Nil in programs.
	Knobs *TestingKnobs
}

// Validate reports whether c is usable.
func (c MachineConfig) Validate() error {
	switch {
	case c.Self.Name == "":
		return errors.New("machine: MachineConfig.Self.Name is empty")
	case c.Partitions <= 0 || c.Partitions > gossip.MaxPartitions:
		return fmt.Errorf("machine: MachineConfig.Partitions = %d, want 1 to %d", c.Partitions, gossip.MaxPartitions)
	case c.GraceTicks < 0 || c.HandoffTicks < 0 || c.StepDownTicks < 0 || c.StableAfterTicks < 0 || c.ShowTicks < 0 ||
		c.RetryTicks < 0 || c.MaxRetryTicks < 0 || c.AcquireTicks < 0 || c.ReleaseTicks < 0 || c.MinQuorum < 0 || c.MaxClaims < 0:
		return errors.New("machine: MachineConfig counts must not be negative")
	case 2*c.ShowTicks > c.StableAfterTicks && c.ShowTicks > 0:
		return fmt.Errorf("machine: MachineConfig.ShowTicks = %d, want at most StableAfterTicks/2 (%d)", c.ShowTicks, c.StableAfterTicks/2)
	case c.Register != nil && c.Register.Partitions() != c.Partitions:
		return fmt.Errorf("machine: MachineConfig.Register has %d partitions, want %d", c.Register.Partitions(), c.Partitions)
	}
	return nil
}

// callKind is a handler call in flight for a partition.
type callKind uint8

const (
	noCall callKind = iota
	acquireCall
	releaseCall
)

// part is the state of one partition on this node.
type part struct {
	phase Phase
	token ownership.Token // our grant: valid from Fencing to Releasing
	// holder is the highest claim known for the partition, ours included.
	holder gossip.Claim
	// mark is the highest token a fence has reported for the partition.
	mark ownership.Token
	// fencedView is the view in which this node was fenced out by a live
	// member; it does not claim again until the view changes (L5). 0 if it
	// was not: views start at 1 with the first placement.
	fencedView uint64
	// rivalUntil: fenced out by a member this node holds dead, it stays
	// out until this tick.
	rivalUntil uint64
	// waitFor is the holder we are waiting on, since tick waitSince.
	waitFor   gossip.Claim
	waitSince uint64
	retryAt   uint64
	failures  int // failed claims, fences and acquires in a row
	// answer is a strict authority's last answer to a failed claim: the
	// next claim goes above it.
	answer    ownership.Token
	hasAnswer bool
	// floor: with a strict authority, claims gossip showed before our
	// claim succeeded are not above our grant, whatever their epochs.
	floor ownership.Token
	// The handler call in flight, if any, and its deadline (0: none).
	call         callKind
	callToken    ownership.Token
	callDeadline uint64
	// lostCause: the lease ended while its Acquire ran; if Acquire
	// succeeds, the handler gets an ActRelease with this cause.
	lostCause error
	// abandoned is the last token whose Acquire overran its deadline: if it
	// succeeds after all, the handler gets an ActRelease.
	abandoned ownership.Token
	// endCause is the cause the lease ends with once a planned release
	// completes.
	endCause error
	// wanting: the ring gives us the partition and we do not serve it yet,
	// since tick wantSince; failover says whether the previous holder
	// vanished without a release.
	wanting   bool
	wantSince uint64
	failover  bool
}

// Machine is the per-node ownership state machine. It is pure and
// deterministic: it holds no goroutine, clock or socket. The shell feeds it
// events through its methods and performs the actions Ready returns, in
// order. It decides everything: quorum and the stable membership, when to
// claim, fence, acquire, serve and release, handoff against failover, and
// the deadlines of handler calls.
//
// A Machine is not safe for concurrent use: the shell serializes calls.
type Machine struct {
	cfg      MachineConfig
	reg      *gossip.Register // the record of claims, gossiped (see MachineConfig.Register)
	parts    []part
	place    Placement
	members  []string          // the view's members, sorted
	lives    map[string]uint64 // their incarnations, where known
	leavers  []string          // the view's members that are leaving
	view     uint64            // bumped by every change of placement
	now      uint64            // ticks
	q        tracker
	noQuorum int  // consecutive ticks without quorum
	reported bool // the quorum last reported by ActQuorum
	claiming int  // partitions in Claiming
	leaving  bool
	out      []Action
	// mine lists, ascending, the partitions the placement of view mineOf
	// gives this node: the only ones a tick steps while the quorum holds
	// (see Tick).
	mine   []uint32
	mineOf uint64
	// nextDeadline is at or before the earliest deadline of a handler call
	// in flight (0: none): a tick before it has no call to expire.
	nextDeadline uint64
	// fullTicks makes every tick look at every call's deadline, and every
	// tick, view and stable membership heard step every partition, as
	// before steps were sparse: the differential test's reference.
	fullTicks bool
}

// NewMachine returns a machine that owns nothing and has no view; it
// claims nothing until SetView.
func NewMachine(cfg MachineConfig) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxRetryTicks == 0 {
		cfg.MaxRetryTicks = 32 * cfg.RetryTicks
	}
	m := &Machine{cfg: cfg, reg: cfg.Register, parts: make([]part, cfg.Partitions)}
	if m.reg == nil {
		reg, err := gossip.NewRegister(cfg.Partitions)
		if err != nil {
			return nil, err
		}
		m.reg = reg
	}
	m.q = tracker{
		self:        cfg.Self.Name,
		bootstrap:   cfg.Bootstrap,
		min:         cfg.MinQuorum,
		stableAfter: uint64(cfg.StableAfterTicks),
		showEvery:   uint64(cfg.ShowTicks),
		retry:       uint64(cfg.RetryTicks),
		maxRetry:    uint64(cfg.MaxRetryTicks),
		knobs:       cfg.Knobs,
	}
	if m.q.eval(0) {
		m.out = append(m.out, Action{Kind: ActStable, Stable: m.q.stable})
		m.q.unshown = true
		m.show()
	}
	m.reported = m.q.ok // ActQuorum reports changes from here
	return m, nil
}

// Ready returns the actions produced since the last call, in the order the
// shell must perform them, and forgets them.
func (m *Machine) Ready() []Action {
	out := m.out
	m.out = nil
	return out
}

// Register returns the machine's record of claims: for every partition the
// highest claim heard or published. It is safe for concurrent use; only
// the machine (and a gossip authority minting into it) writes to it.
func (m *Machine) Register() *gossip.Register { return m.reg }

// Now returns the machine's logical time in ticks.
func (m *Machine) Now() uint64 { return m.now }

// Phase returns the partition's phase and this node's token for it (zero
// while Unowned or Claiming).
func (m *Machine) Phase(p uint32) (Phase, ownership.Token) {
	if int(p) >= len(m.parts) {
		return Unowned, ownership.Token{}
	}
	s := &m.parts[p]
	return s.phase, s.token
}

// Holder returns the highest claim known for partition p.
func (m *Machine) Holder(p uint32) gossip.Claim {
	if int(p) >= len(m.parts) {
		return gossip.Claim{}
	}
	return m.parts[p].holder
}

// Quorum reports whether this node sees a quorum now.
func (m *Machine) Quorum() bool { return m.q.ok }

// Stable returns the stable membership quorum is counted against.
func (m *Machine) Stable() quorum.Stable { return m.q.stable }

// QuorumState is what a node's quorum rests on, to say why it has none.
type QuorumState struct {
	// OK: the node counts a quorum (Quorum).
	OK bool
	// Min is the Config's MinQuorum: when above 0, OK is Members >= Min
	// and the rest does not count.
	Min int
	// Outdated: a member of the view shows a newer stable membership
	// (within MaxStableJump) than the node holds: it counts no quorum
	// until it learns that one.
	Outdated bool
	// Doubt: the node heard a newer stable membership of which it knows no
	// quorum (in its view and its own set): it counts no quorum until that
	// expires, StableAfter after it was last heard, or it knows a quorum
	// of it.
	Doubt bool
	// Reached is how many members of the stable membership the node
	// reaches (in its view, and not unreachable), itself included.
	Reached int
	// Stable is how many members the stable membership has; 0 while the
	// node holds none.
	Stable int
	// Members is how many members of the view the node reaches, itself
	// included, in the stable membership or not.
	Members int
}

// QuorumState returns what the node's quorum rests on now.
func (m *Machine) QuorumState() QuorumState { return m.q.state() }

// Idle reports whether no partition is held or in transit and no handler
// call runs: after Leave, the shell waits for Idle before leaving the
// membership.
func (m *Machine) Idle() bool {
	for i := range m.parts {
		if m.parts[i].phase != Unowned || m.parts[i].call != noCall {
			return false
		}
	}
	return true
}

// SetView installs a new view of the membership.
func (m *Machine) SetView(v View) error {
	if v.Placement != nil && v.Placement.Partitions() != m.cfg.Partitions {
		return fmt.Errorf("machine: placement has %d partitions, machine %d", v.Placement.Partitions(), m.cfg.Partitions)
	}
	fp := func(p Placement) uint64 {
		if p == nil {
			return 0
		}
		return p.Fingerprint()
	}
	view := m.view
	if m.view == 0 || (m.place == nil) != (v.Placement == nil) || fp(m.place) != fp(v.Placement) {
		m.view++
	}
	m.place = v.Placement
	members := make([]string, 0, len(v.Members))
	var leavers []string
	var lives map[string]uint64
	for _, vm := range v.Members {
		members = append(members, vm.Name)
		if vm.Leaving {
			leavers = append(leavers, vm.Name)
		}
		if vm.Incarnation != 0 {
			if lives == nil {
				lives = make(map[string]uint64)
			}
			lives[vm.Name] = vm.Incarnation
		}
	}
	slices.Sort(members)
	members = slices.Compact(members)
	// What a step of a partition placed elsewhere reads of the view: the
	// placement and who is live in which life (the leavers matter only to
	// the partitions placed here, which are stepped in any case). A view
	// that changes neither (a member's stable membership or reachability,
	// as metadata shows it) changes no such step but through the quorum.
	same := m.view == view && slices.Equal(members, m.members) && maps.Equal(lives, m.lives)
	m.members, m.leavers, m.lives = members, leavers, lives
	wasOK := m.q.ok
	m.quorumStep(m.q.setView(m.now, v.Members, v.Left))
	m.stepChanged(same, wasOK)
	return nil
}

// HeardStable records a stable membership heard from another node.
func (m *Machine) HeardStable(s quorum.Stable) {
	wasOK := m.q.ok
	m.quorumStep(m.q.heard(m.now, s))
	m.stepChanged(true, wasOK)
}

// stepChanged steps what an input moved. same: the input left the
// placement and the members and their lives as they were; wasOK: the
// quorum before it. When the input changed one of those, or the quorum,
// it steps every partition. Otherwise it steps only those a step could
// move (see Tick): while the quorum holds, the partitions placed here;
// while it is missing, those too and every partition not settled (it may
// step down, or has just). A settled partition placed elsewhere wants
// nothing and waits for nothing without a quorum, so its step would do
// nothing, and its own inputs step it themselves. At 100 x 4096 every
// join made each of 100 nodes re-advertise its stable membership, and
// each of those views stepped all 4096 partitions on every node; at the
// start, while nodes learnt the set, so did every tick without a quorum
// (issue 22).
func (m *Machine) stepChanged(same, wasOK bool) {
	switch {
	case m.fullTicks || !same || m.q.ok != wasOK:
		m.stepAll()
	case m.q.ok:
		for _, p := range m.placedHere() {
			m.step(p)
		}
	default:
		mine := m.placedHere()
		for p := range uint32(len(m.parts)) {
			switch {
			case len(mine) > 0 && mine[0] == p:
				mine = mine[1:]
			case m.parts[p].settled(m.now):
				continue
			}
			m.step(p)
		}
	}
}

// settled reports whether the partition is Unowned and wants and waits
// for nothing: without a quorum, a step of it does nothing unless it is
// placed here. A partition that wants nothing waits for no holder: step
// sets waitFor only while wanting, and clears it when it stops wanting or
// claims (the comparison of waitFor was a third of the cost of a tick).
func (s *part) settled(now uint64) bool {
	return s.phase == Unowned && !s.wanting && now >= s.rivalUntil
}

// show emits ActShow when the stable membership differs from the one this
// node's metadata shows and may be shown now: the first at once, a later
// one ShowTicks after the last show.
func (m *Machine) show() {
	q := &m.q
	if !q.unshown || q.showing != (quorum.StableID{}) && m.now-q.shownAt < q.showEvery {
		return
	}
	// Stable IDs only rise: a change is never back to the ID shown.
	q.unshown, q.showing, q.shownAt = false, q.stable.ID(), m.now
	m.out = append(m.out, Action{Kind: ActShow, Stable: q.stable})
}

// quorumStep emits what a change of the quorum state calls for.
func (m *Machine) quorumStep(changed bool) {
	if changed {
		m.out = append(m.out, Action{Kind: ActStable, Stable: m.q.stable})
		m.q.unshown = true
	}
	m.show()
	for _, a := range m.q.asks(m.now) {
		m.out = append(m.out, Action{Kind: ActSync, Node: a.node, Tries: a.tries})
	}
	if m.q.ok != m.reported {
		m.reported = m.q.ok
		m.out = append(m.out, Action{Kind: ActQuorum, OK: m.q.ok})
	}
}

// Tick advances logical time by one tick.
func (m *Machine) Tick() {
	m.now++
	wasOK := m.q.ok
	m.quorumStep(m.q.eval(m.now))
	// Counted at ticks only: a quorum that comes back for an instant
	// between ticks (a node that keeps learning and losing a newer stable
	// membership) does not put off the step-down.
	if m.q.ok {
		m.noQuorum = 0
	} else {
		m.noQuorum++
	}
	expired := m.expireDue()
	// While the quorum holds through the tick and no call expires (an
	// expiry changes its partition, which a step must follow), time alone
	// moves only the partitions placed here (a claim's wait for its
	// holder, its backoff, a rival's respect, MaxClaims' queue). Every
	// other partition was stepped when what it depends on last changed
	// (the view, the quorum, leaving, its own input), and a step of it now
	// would do nothing: an Unowned one is not wanted, an Owned one was
	// released then, and no other phase moves in step while the quorum
	// holds. While it is missing through the tick, the partitions not
	// settled are stepped too: time brings their step-down.
	m.stepChanged(!expired, wasOK)
}

// placedHere returns the partitions the current placement gives this
// node, ascending, computed once per view.
func (m *Machine) placedHere() []uint32 {
	if m.mineOf == m.view {
		return m.mine
	}
	m.mine, m.mineOf = m.mine[:0], m.view
	if m.place != nil {
		for p := range uint32(m.cfg.Partitions) {
			if m.place.Owner(p) == m.cfg.Self.Name {
				m.mine = append(m.mine, p)
			}
		}
	}
	return m.mine
}

// expireDue ends the handler calls whose deadline has come (expire) and
// reports whether any did. It looks at the partitions only when the
// earliest deadline may have come.
func (m *Machine) expireDue() bool {
	if !m.fullTicks && (m.nextDeadline == 0 || m.now < m.nextDeadline) {
		return false
	}
	m.nextDeadline = 0
	expired := false
	for p := range m.parts {
		s := &m.parts[p]
		switch {
		case s.call == noCall || s.callDeadline == 0:
		case m.now >= s.callDeadline:
			m.expire(uint32(p))
			expired = true
		default:
			m.noteDeadline(s.callDeadline)
		}
	}
	return expired
}

// noteDeadline keeps nextDeadline at or before d.
func (m *Machine) noteDeadline(d uint64) {
	if m.nextDeadline == 0 || d < m.nextDeadline {
		m.nextDeadline = d
	}
}

// Leave starts a graceful exit: every held partition is released and
// nothing is claimed again. Wait for Idle.
func (m *Machine) Leave() {
	m.leaving = true
	m.stepAll()
}

// Shutdown ends every lease with cause, as a crash would: nothing is
// published, and the handler is told of each lease it had acquired (an
// after-the-fact ActRelease). The machine takes no input after it.
func (m *Machine) Shutdown(cause error) {
	m.leaving = true
	for p := range m.parts {
		if m.parts[p].phase >= Fencing {
			m.end(uint32(p), cause, true)
		}
	}
}

// Heard records a claim or release heard from gossip (or read anywhere
// else), in the register and in the machine's own state. A claim above
// this node's grant supersedes it: the lease ends.
//
// It reports whether the claim was new to the register: only then should
// the shell pass it on, so claims spread epidemically and not only from
// their origin. A claim that would raise its partition's epoch by more
// than gossip.MaxEpochJump is refused (an error wrapping
// ownership.ErrMalformedToken) and changes nothing. A claim with the zero
// token or for a partition out of range is ignored (false, nil).
func (m *Machine) Heard(c gossip.Claim) (bool, error) {
	p := c.Token.Partition
	if int(p) >= len(m.parts) || c.Token.IsZero() {
		return false, nil
	}
	changed, err := m.reg.ObserveHeard(c)
	if err != nil {
		return false, err
	}
	s := &m.parts[p]
	if !s.observe(c) {
		return changed, nil
	}
	if s.phase >= Fencing && c.Token.Compare(s.token) > 0 && c.Token.Compare(s.floor) > 0 {
		m.lose(p, c.Token, ownership.ErrLeaseSuperseded)
	}
	m.step(p)
	return changed, nil
}

// Claimed feeds the authority's answer to an ActClaim for partition p.
func (m *Machine) Claimed(p uint32, t ownership.Token, err error) {
	if int(p) >= len(m.parts) {
		return
	}
	s := &m.parts[p]
	if s.phase != Claiming {
		return
	}
	m.claiming--
	if err == nil && (t.Partition != p || t.Node() != m.cfg.Self) {
		err = fmt.Errorf("machine: authority answered %v to a claim of p%d by %v", t, p, m.cfg.Self)
	}
	if err != nil {
		s.phase = Unowned
		var ce *ownership.ConflictError
		if errors.As(err, &ce) && (ce.Partition == p || ce.Partition == 0 && ce.Current.Partition == p) {
			// Someone else won, perhaps long ago (its claim may never reach
			// us by gossip: it was made across a cut, or before the fence
			// table was reset). Learn what the authority holds.
			cur := ce.Current
			if !cur.IsZero() && cur.Partition == p {
				if cur.Compare(s.mark) > 0 {
					s.mark = cur
				}
				s.observe(gossip.Claim{Token: cur})
			}
			if m.cfg.StrictAuthority {
				s.answer, s.hasAnswer = cur, true
				s.answer.Partition = p
			}
		}
		m.failed(p)
		m.step(p)
		return
	}
	if t.Compare(s.holder.Token) < 0 && !m.cfg.StrictAuthority {
		// A higher claim arrived while we were claiming: we lost the race
		// unless that claim has since been released. (Our own token may
		// have come back first, through a push/pull carrying the register
		// the authority minted it in: that is no rival.)
		s.phase = Unowned
		if !s.holder.Released {
			m.lose(p, s.holder.Token, ownership.ErrLeaseSuperseded)
		}
		m.step(p)
		return
	}
	s.hasAnswer = false
	if m.cfg.StrictAuthority && t.Compare(s.holder.Token) < 0 {
		s.floor = s.holder.Token
	} else {
		s.floor = ownership.Token{}
		s.holder = gossip.Claim{Token: t}
	}
	s.token = t
	if !m.wants(p) {
		// The ring moved on while we claimed: give the epoch back.
		s.phase = Unowned
		s.token = ownership.Token{}
		s.observe(gossip.Claim{Token: t, Released: true})
		m.publish(t, true)
		m.step(p)
		return
	}
	m.publish(t, false)
	if m.cfg.Fenced && (m.cfg.Knobs == nil || !m.cfg.Knobs.SkipFence) {
		s.phase = Fencing
		m.emit(Action{Kind: ActFence, Token: t})
		return
	}
	m.startAcquire(p)
}

// Fenced feeds the outcome of an ActFence. A *StaleTokenError means the
// resource holds a higher token.
func (m *Machine) Fenced(t ownership.Token, err error) {
	s := m.held(t)
	if s == nil || s.phase != Fencing {
		return
	}
	p := t.Partition
	var stale *ownership.StaleTokenError
	switch {
	case err == nil:
		m.startAcquire(p)
	case errors.As(err, &stale):
		m.lose(p, stale.Current, ownership.ErrLeaseSuperseded)
		m.step(p)
	default:
		m.giveBack(p, ownership.ErrLeaseFailed, false)
		m.failed(p)
		m.step(p)
	}
}

func (m *Machine) startAcquire(p uint32) {
	s := &m.parts[p]
	s.phase = Acquiring
	s.lostCause = nil
	m.startCall(p, acquireCall, s.token, m.cfg.AcquireTicks)
	m.emit(Action{Kind: ActAcquire, Token: s.token})
}

func (m *Machine) startCall(p uint32, k callKind, t ownership.Token, ticks int) {
	s := &m.parts[p]
	s.call, s.callToken, s.callDeadline = k, t, 0
	if ticks > 0 {
		s.callDeadline = m.now + uint64(ticks)
		m.noteDeadline(s.callDeadline)
	}
}

// Acquired feeds the outcome of an ActAcquire: the handler's Acquire. A
// *StaleTokenError means a resource the handler fenced holds a higher
// token.
func (m *Machine) Acquired(t ownership.Token, err error) {
	if int(t.Partition) >= len(m.parts) {
		return
	}
	p := t.Partition
	s := &m.parts[p]
	ours := s.call == acquireCall && s.callToken.Same(t)
	if ours {
		s.call = noCall
	}
	late := !ours && !t.IsZero() && s.abandoned.Same(t)
	if late {
		s.abandoned = ownership.Token{}
	}
	if !ours && !late {
		return // not an Acquire we started, or answered already
	}
	if s.phase != Acquiring || !s.token.Same(t) {
		// The lease ended while Acquire ran (or Acquire overran and was
		// abandoned). The handler thinks it holds the lease: let it clean
		// up.
		if err == nil {
			cause := s.lostCause
			if late || cause == nil {
				cause = ownership.ErrLeaseTimeout
			}
			if ours {
				m.startCall(p, releaseCall, t, m.cfg.ReleaseTicks)
			}
			m.emit(Action{Kind: ActRelease, Token: t, Cause: cause})
		}
		if ours {
			s.lostCause = nil
		}
		m.step(p)
		return
	}
	var stale *ownership.StaleTokenError
	switch {
	case err == nil:
		s.phase = Owned
		s.failures = 0
		a := Action{Kind: ActServe, Token: t}
		if s.wanting {
			a.Waited, a.Failover = m.now-s.wantSince, s.failover
			s.wanting = false
		}
		m.emit(a)
	case errors.As(err, &stale):
		m.lose(p, stale.Current, ownership.ErrLeaseSuperseded)
	default:
		m.giveBack(p, ownership.ErrLeaseFailed, false)
		m.failed(p)
	}
	m.step(p)
}

// Rejected reports that the resource rejected a write under t because it
// holds current, a higher token: the lease of t ends.
func (m *Machine) Rejected(t ownership.Token, current ownership.Token) {
	if m.held(t) == nil || current.Partition != t.Partition || current.Compare(t) <= 0 {
		return
	}
	m.lose(t.Partition, current, ownership.ErrLeaseSuperseded)
	m.step(t.Partition)
}

// NotFenced reports that a write under t found the resource's mark below
// t: the resource lost its fence (a reset, a restore). The lease ends, so
// the handler re-reads the resource under a new, fenced lease.
func (m *Machine) NotFenced(t ownership.Token) {
	s := m.held(t)
	if s == nil || s.phase < Acquiring {
		return
	}
	m.giveBack(t.Partition, ownership.ErrLeaseNotFenced, true)
	m.failed(t.Partition)
	m.step(t.Partition)
}

// Resign gives the lease of t back. With ended false the lease is live: the
// handler drains (a planned ActRelease) before the release is published.
// With ended true something already ended the lease (the handler called
// Lease.End): the release is published at once. Either way the node waits
// out a backoff before claiming the partition again.
//
// It returns ownership.ErrLeaseEnded, and changes nothing, when t is not a
// lease this node may resign: not its grant (zero, stale, or the partition
// is unowned or still being claimed), or, with ended false, a lease
// already being released.
func (m *Machine) Resign(t ownership.Token, ended bool) error {
	s := m.held(t)
	if s == nil || s.phase == Releasing && !ended {
		return ownership.ErrLeaseEnded
	}
	p := t.Partition
	switch {
	case s.phase == Owned && !ended:
		m.planRelease(p, ownership.ErrLeaseResigned)
	case s.phase == Releasing:
		// Already on its way out.
	default:
		m.giveBack(p, ownership.ErrLeaseResigned, true)
	}
	m.failed(p)
	m.step(p)
	return nil
}

// Released reports that the handler's Release for t has returned.
func (m *Machine) Released(t ownership.Token) {
	if int(t.Partition) >= len(m.parts) {
		return
	}
	s := &m.parts[t.Partition]
	if s.call == releaseCall && s.callToken.Same(t) {
		s.call = noCall
	}
	if s.phase == Releasing && s.token.Same(t) {
		m.giveBack(t.Partition, s.endCause, false)
	}
	m.step(t.Partition)
}

// expire ends handler calls that overran their deadline.
func (m *Machine) expire(p uint32) {
	s := &m.parts[p]
	if s.call == noCall || s.callDeadline == 0 || m.now < s.callDeadline {
		return
	}
	k, t := s.call, s.callToken
	s.call = noCall
	if k == acquireCall {
		s.abandoned = t
	}
	if !s.token.Same(t) {
		return
	}
	switch {
	case k == acquireCall && s.phase == Acquiring:
		m.giveBack(p, ownership.ErrLeaseTimeout, false)
		m.failed(p)
	case k == releaseCall && s.phase == Releasing:
		m.giveBack(p, ownership.ErrLeaseTimeout, false)
	}
}

// held returns the state of t's partition if t is this node's grant of it
// (Fencing to Releasing), and nil otherwise.
func (m *Machine) held(t ownership.Token) *part {
	if int(t.Partition) >= len(m.parts) {
		return nil
	}
	s := &m.parts[t.Partition]
	if s.phase < Fencing || !s.token.Same(t) {
		return nil
	}
	return s
}

// planRelease starts a planned release: the handler drains, then the lease
// ends with cause.
func (m *Machine) planRelease(p uint32, cause error) {
	s := &m.parts[p]
	s.phase = Releasing
	s.endCause = cause
	m.startCall(p, releaseCall, s.token, m.cfg.ReleaseTicks)
	m.emit(Action{Kind: ActRelease, Token: s.token})
}

// giveBack ends this node's grant of p with cause and publishes its
// release, so the next owner may claim without waiting out a grace period.
// cleanup: the handler acquired the lease and gets an after-the-fact
// ActRelease.
func (m *Machine) giveBack(p uint32, cause error, cleanup bool) {
	s := &m.parts[p]
	t := s.token
	m.end(p, cause, cleanup)
	m.publish(t, true)
	s.observe(gossip.Claim{Token: t, Released: true})
}

// end ends the lease of p with cause and leaves the partition Unowned.
// cleanup asks for an after-the-fact ActRelease when the handler holds the
// lease (Owned); a lease lost while its Acquire runs gets one when Acquire
// succeeds.
func (m *Machine) end(p uint32, cause error, cleanup bool) {
	s := &m.parts[p]
	t := s.token
	m.emit(Action{Kind: ActEnd, Token: t, Cause: cause})
	switch {
	case s.phase == Acquiring:
		s.lostCause = cause
	case s.phase == Owned && cleanup:
		m.startCall(p, releaseCall, t, m.cfg.ReleaseTicks)
		m.emit(Action{Kind: ActRelease, Token: t, Cause: cause})
	}
	s.phase = Unowned
	s.token = ownership.Token{}
	s.floor = ownership.Token{}
}

// failed counts a failure in a row for p and sets its backoff.
func (m *Machine) failed(p uint32) {
	s := &m.parts[p]
	s.failures++
	s.retryAt = m.now + m.backoff(s.failures)
}

// backoff returns the wait after n failures in a row: RetryTicks doubled
// n-1 times, at most MaxRetryTicks, less up to half of it at random.
func (m *Machine) backoff(n int) uint64 {
	if m.cfg.Knobs != nil && m.cfg.Knobs.NoClaimBackoff {
		return 0
	}
	d := uint64(m.cfg.RetryTicks)
	for i := 1; i < n && d < uint64(m.cfg.MaxRetryTicks); i++ {
		d *= 2
	}
	d = min(d, uint64(m.cfg.MaxRetryTicks))
	if m.cfg.Rand != nil && d > 1 {
		d -= m.cfg.Rand.Uint64N(d/2 + 1)
	}
	return d
}

// observe raises the highest claim known for the partition to c, if c is
// higher, and reports whether it did.
func (s *part) observe(c gossip.Claim) bool {
	if c.Compare(s.holder) <= 0 {
		return false
	}
	s.holder = c
	return true
}

// lose ends this node's grant of p because a higher token exists.
func (m *Machine) lose(p uint32, higher ownership.Token, cause error) {
	s := &m.parts[p]
	if higher.Compare(s.mark) > 0 {
		s.mark = higher
	}
	s.observe(gossip.Claim{Token: higher})
	if s.phase >= Fencing {
		m.end(p, cause, true)
	}
	s.phase = Unowned
	// A live member holds the partition: stay out until the view changes,
	// so two nodes with different views don't fence each other in turn.
	// A former self holds nothing that needs respecting. A member this
	// node holds dead that has just claimed above it is alive to someone:
	// views are not transitive (it and this node can't reach each other,
	// others reach both), and claiming back after the grace period would
	// duel it at the pace of Grace. Respect it for StableAfter, the time
	// views take to settle, then treat it as the dead holder it may be;
	// if it shows up in this node's view first, it is a live member like
	// any other from then on (see step).
	if m.cfg.Knobs != nil && m.cfg.Knobs.ForgetFencedView {
		return
	}
	switch {
	case m.live(higher):
		s.fencedView = m.view
	case higher.Owner != m.cfg.Self.Name:
		s.rivalUntil = m.now + uint64(m.cfg.StableAfterTicks)
	}
}

// live reports whether t's owner is another node in the current view, in
// the life that holds t (when the view says which life is current).
func (m *Machine) live(t ownership.Token) bool {
	if t.Owner == m.cfg.Self.Name {
		return false // us, or our previous incarnation
	}
	if _, ok := slices.BinarySearch(m.members, t.Owner); !ok {
		return false
	}
	inc, known := m.lives[t.Owner]
	return !known || inc == t.Incarnation
}

// wants reports whether this node should hold p now.
func (m *Machine) wants(p uint32) bool {
	return m.place != nil && !m.leaving && m.q.ok && m.place.Owner(p) == m.cfg.Self.Name
}

// stepDown reports whether the quorum has been missing long enough to end
// every lease.
func (m *Machine) stepDown() bool {
	if m.cfg.Knobs != nil && m.cfg.Knobs.NoStepDown {
		return false
	}
	return !m.q.ok && m.noQuorum >= m.cfg.StepDownTicks
}

func (m *Machine) stepAll() {
	for p := range m.parts {
		m.step(uint32(p))
	}
}

// step moves partition p as far as it can go without new input.
func (m *Machine) step(p uint32) {
	s := &m.parts[p]
	if s.phase >= Fencing && m.stepDown() {
		// L4: no quorum for too long; stop serving. The release is queued
		// for gossip: it reaches the others after the heal, so a node that
		// claimed the partition meanwhile with a lower epoch learns it is
		// free instead of waiting for this node.
		m.giveBack(p, ownership.ErrLeaseNoQuorum, true)
		return
	}
	switch s.phase {
	case Owned:
		if !m.wants(p) && (m.q.ok || m.leaving) {
			// Planned move or leave: drain, then release.
			m.planRelease(p, ownership.ErrLeaseReleased)
		}
	case Unowned:
		if m.now < s.rivalUntil && !s.holder.Released && m.live(s.holder.Token) {
			// The rival this node could not see is in its view now: a
			// live member like any other. Respect it as one, until the
			// view changes, and no longer for StableAfter: if it crashes
			// next, its partition waits Grace, not what is left of the
			// respect.
			s.rivalUntil, s.fencedView = 0, m.view
		}
		if !m.wants(p) {
			if !m.q.ok && !m.leaving && m.place != nil && m.place.Owner(p) == m.cfg.Self.Name {
				// Placed here, but no quorum: claim nothing, and keep the
				// wait for the holder running. Its time to step down does
				// not start over because this node's quorum blinked.
				return
			}
			s.waitFor, s.wanting = gossip.Claim{}, false
			return
		}
		if !s.wanting {
			h := s.holder
			s.wanting, s.wantSince = true, m.now
			s.failover = !h.Token.IsZero() && !h.Released && h.Token.Owner != m.cfg.Self.Name && !m.live(h.Token)
		}
		if s.fencedView == m.view && !s.holder.Released && m.live(s.holder.Token) {
			// Fenced out by a live rival: don't contest it until the view
			// changes (L5), unless it has since released the partition or
			// died (a restart under the same name changes no placement).
			return
		}
		if m.now < s.rivalUntil && !s.holder.Released && s.holder.Token.Owner != m.cfg.Self.Name {
			// Fenced out by a rival this node can't see (see lose). Its
			// grace period as a dead holder runs meanwhile, so that it
			// does not start only when the respect ends.
			if s.waitFor != s.holder {
				s.waitFor, s.waitSince = s.holder, m.now
			}
			return
		}
		s.fencedView = 0
		if !m.mayClaim(p) || m.now < s.retryAt || s.call != noCall ||
			m.cfg.MaxClaims > 0 && m.claiming >= m.cfg.MaxClaims {
			return
		}
		s.waitFor = gossip.Claim{}
		s.phase = Claiming
		m.claiming++
		seen := s.holder.Token
		if s.mark.Compare(seen) > 0 {
			seen = s.mark
		}
		if s.hasAnswer {
			seen = s.answer
		}
		seen.Partition = p
		m.emit(Action{Kind: ActClaim, Partition: p, Token: seen})
	}
}

// mayClaim decides, for an unowned partition the ring assigns here, whether
// the current holder (if any) lets us claim now.
func (m *Machine) mayClaim(p uint32) bool {
	s := &m.parts[p]
	h := s.holder
	if h.Token.IsZero() || h.Released || h.Token.Owner == m.cfg.Self.Name {
		return true
	}
	if s.waitFor != h {
		s.waitFor, s.waitSince = h, m.now
	}
	waited := m.now - s.waitSince
	if m.live(h.Token) {
		// A planned move: the holder releases when it sees the same ring.
		// A leaving holder is draining already: wait for its release
		// while its drain runs late on a busy machine (up to
		// LeaverWaitFactor times HandoffTicks), or a write it is
		// finishing under its token is rejected (L2). Its own Leave
		// bounds the drain (ReleaseTimeout on its clock, then its
		// goodbye), and once it is no longer live, Grace applies; the cap
		// is for a leaver whose loop is wedged while memberlist still
		// answers for it (L1).
		limit := uint64(m.cfg.HandoffTicks)
		if slices.Contains(m.leavers, h.Token.Owner) {
			limit *= LeaverWaitFactor
		}
		if waited < limit {
			return false
		}
	} else if waited < uint64(m.cfg.GraceTicks) {
		// The holder left without a release: give it the grace period.
		return false
	}
	return true
}

// publish records the claim (t, released) in the register and asks the
// shell to gossip it.
func (m *Machine) publish(t ownership.Token, released bool) {
	c := gossip.Claim{Token: t, Released: released}
	m.emit(Action{Kind: ActPublish, Token: t, Released: released, New: m.reg.ObserveClaim(c)})
}

func (m *Machine) emit(a Action) {
	if a.Partition == 0 {
		a.Partition = a.Token.Partition
	}
	m.out = append(m.out, a)
}
