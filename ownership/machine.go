package ownership

import (
	"errors"
	"fmt"
)

// Placement is what the state machine needs from a partition table: which
// member the ring assigns each partition to, and who the members are.
// *ring.Table satisfies it.
type Placement interface {
	Partitions() int
	Owner(partition uint32) string
	Has(member string) bool
	// Fingerprint identifies the member set and configuration: equal
	// placements have equal fingerprints.
	Fingerprint() uint64
}

// Phase is where one partition stands on this node.
type Phase uint8

// The phases of a partition, in the order a grant goes through them.
const (
	Unowned   Phase = iota // not held here
	Claiming               // waiting for the authority to mint a token
	Acquiring              // token minted; the handler is fencing the resource
	Owned                  // fenced and serving
	Releasing              // the handler is draining before the release is published
)

var phaseNames = [...]string{"unowned", "claiming", "acquiring", "owned", "releasing"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// ActionKind says what the shell must do for an Action.
type ActionKind uint8

const (
	// Claim: ask the Authority for a token for Partition strictly above
	// Token (the highest token this node knows), then feed the answer to
	// Machine.Claimed.
	ActClaim ActionKind = iota + 1
	// Acquire: start a lease for Token, fence the resource with it and call
	// the handler's Acquire; feed the outcome to Machine.Acquired.
	ActAcquire
	// Release: call the handler's Release for the lease of Token (the
	// handler drains); when it returns or overruns, call Machine.Released.
	ActRelease
	// Publish: gossip the claim (Token, Released) to the other nodes.
	ActPublish
	// Revoke: end the lease of Token now (cancel its context). Its writes
	// may already be rejected by the resource.
	ActRevoke
)

var actNames = [...]string{"", "claim", "acquire", "release", "publish", "revoke"}

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
	// Token: for ActClaim, the highest token known for the partition (the
	// authority mints above it; zero if none); otherwise the lease's token.
	Token Token
	// Released: for ActPublish, whether the claim is a release.
	Released bool
}

func (a Action) String() string {
	s := fmt.Sprintf("%v p%d %s", a.Kind, a.Partition, tokenShort(a.Token))
	if a.Released {
		s += " released"
	}
	return s
}

func tokenShort(t Token) string {
	if t.IsZero() {
		return "none"
	}
	return fmt.Sprintf("e%d/%s:%d", t.Epoch, t.Owner, t.Incarnation)
}

// MachineConfig configures a Machine. Durations are in ticks of logical
// time: the shell calls Tick at a fixed interval and chooses it.
type MachineConfig struct {
	// Self is this node. Required.
	Self Node
	// Partitions is the number of partitions; it must equal the
	// placement's. Required.
	Partitions int
	// GraceTicks is how long to wait before claiming a partition whose
	// holder left the membership without publishing a release (a crash or a
	// partition). Longer grace gives a paused or cut-off holder time to
	// notice and stop (fewer rejected writes); shorter grace fails over
	// faster. Safety does not depend on it. Default 0: claim at once.
	GraceTicks int
	// HandoffTicks is how long to wait for a live holder to release a
	// partition the ring has moved here before claiming it anyway (the
	// holder is then fenced). Default 0 means wait forever (a live holder
	// always releases once it sees the same ring).
	HandoffTicks int
	// StepDownTicks: after this many consecutive ticks without a quorum,
	// every lease is revoked (L4). Choose it below the lease duration the
	// others assume. Default 0: revoke on the first tick without quorum.
	StepDownTicks int
	// RetryTicks is the wait after a failed claim or acquire before the
	// next try. Default 0: retry on the next tick.
	RetryTicks int
}

// Validate reports whether c is usable.
func (c MachineConfig) Validate() error {
	switch {
	case c.Self.Name == "":
		return errors.New("ownership: MachineConfig.Self.Name is empty")
	case c.Partitions <= 0:
		return fmt.Errorf("ownership: MachineConfig.Partitions = %d, want > 0", c.Partitions)
	case c.GraceTicks < 0 || c.HandoffTicks < 0 || c.StepDownTicks < 0 || c.RetryTicks < 0:
		return errors.New("ownership: MachineConfig tick counts must not be negative")
	}
	return nil
}

// part is the state of one partition on this node.
type part struct {
	phase Phase
	token Token // our grant: valid in Claiming (zero), Acquiring, Owned, Releasing
	// holder is the highest claim known for the partition, ours included.
	holder Claim
	// mark is the highest token a fence has reported for the partition.
	mark Token
	// fencedView is the view in which this node was fenced out by a live
	// member; it does not claim again until the view changes (L5). 0 if it
	// was not: views start at 1 with the first placement.
	fencedView uint64
	// waitFor is the holder we are waiting on, since tick waitSince; the
	// zero claim if none.
	waitFor   Claim
	waitSince uint64
	retryAt   uint64
}

// Machine is the per-node ownership state machine. It is pure and
// deterministic: it holds no goroutine, clock or socket. The shell feeds it
// events through its methods and performs the actions Ready returns, in
// order.
//
// A Machine is not safe for concurrent use: the shell serializes calls.
type Machine struct {
	cfg      MachineConfig
	parts    []part
	place    Placement
	view     uint64 // bumped by every SetPlacement
	now      uint64 // ticks
	quorum   bool
	noQuorum int // consecutive ticks without quorum
	leaving  bool
	out      []Action
}

// NewMachine returns a machine that owns nothing and has no placement; it
// claims nothing until SetPlacement.
func NewMachine(cfg MachineConfig) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Machine{cfg: cfg, parts: make([]part, cfg.Partitions), quorum: true}, nil
}

// Ready returns the actions produced since the last call, in the order the
// shell must perform them, and forgets them.
func (m *Machine) Ready() []Action {
	out := m.out
	m.out = nil
	return out
}

// Phase returns the partition's phase and this node's token for it (zero
// unless Acquiring, Owned or Releasing).
func (m *Machine) Phase(p uint32) (Phase, Token) {
	if int(p) >= len(m.parts) {
		return Unowned, Token{}
	}
	s := &m.parts[p]
	return s.phase, s.token
}

// Holder returns the highest claim known for partition p.
func (m *Machine) Holder(p uint32) Claim {
	if int(p) >= len(m.parts) {
		return Claim{}
	}
	return m.parts[p].holder
}

// Idle reports whether no partition is in transit or held: after Leave, the
// shell waits for Idle before leaving the membership.
func (m *Machine) Idle() bool {
	for i := range m.parts {
		if m.parts[i].phase != Unowned {
			return false
		}
	}
	return true
}

// SetPlacement installs a new ring table: a new view of membership.
// Partitions whose owner did not change are not touched.
func (m *Machine) SetPlacement(pl Placement) error {
	if pl == nil {
		return errors.New("ownership: nil placement")
	}
	if pl.Partitions() != m.cfg.Partitions {
		return fmt.Errorf("ownership: placement has %d partitions, machine %d", pl.Partitions(), m.cfg.Partitions)
	}
	if m.place == nil || m.place.Fingerprint() != pl.Fingerprint() {
		m.view++
	}
	m.place = pl
	m.stepAll()
	return nil
}

// SetQuorum tells the machine whether this node sees a quorum of the last
// stable membership. Without one it claims nothing, and after StepDownTicks
// ticks it revokes every lease.
func (m *Machine) SetQuorum(ok bool) {
	if ok == m.quorum {
		return
	}
	m.quorum = ok
	if ok {
		m.noQuorum = 0
	}
	m.stepAll()
}

// Tick advances logical time by one tick.
func (m *Machine) Tick() {
	m.now++
	if !m.quorum {
		m.noQuorum++
	}
	m.stepAll()
}

// Leave starts a graceful exit: every held partition is released and
// nothing is claimed again. Wait for Idle.
func (m *Machine) Leave() {
	m.leaving = true
	m.stepAll()
}

// Heard records a claim or release heard from gossip (or read anywhere
// else). A claim above this node's grant supersedes it: the lease is revoked.
func (m *Machine) Heard(c Claim) {
	p := c.Token.Partition
	if int(p) >= len(m.parts) {
		return
	}
	s := &m.parts[p]
	if !s.observe(c) {
		return
	}
	if s.phase >= Acquiring && c.Token.Compare(s.token) > 0 {
		// Someone holds a higher grant: ours is dead.
		m.lose(p, c.Token)
	}
	m.step(p)
}

// Claimed feeds the authority's answer to an ActClaim for partition p.
func (m *Machine) Claimed(p uint32, t Token, err error) {
	if int(p) >= len(m.parts) {
		return
	}
	s := &m.parts[p]
	if s.phase != Claiming {
		return
	}
	if err != nil {
		s.phase = Unowned
		s.retryAt = m.now + uint64(m.cfg.RetryTicks)
		if errors.Is(err, ErrConflict) {
			// Someone else won a race: look again at once. Learn the mark
			// the authority reported: its claim may never reach us by
			// gossip (it was made across a network cut), and claiming
			// above what we had heard would lose forever.
			var ce *ConflictError
			if errors.As(err, &ce) && (ce.Partition == p || ce.Partition == 0) &&
				ce.Current.Partition == p && ce.Current.Compare(s.mark) > 0 {
				s.mark = ce.Current
				s.observe(Claim{Token: ce.Current})
			}
			s.retryAt = m.now
		}
		m.step(p)
		return
	}
	if t.Partition != p || t.Node() != m.cfg.Self {
		// The authority answered with something we can't use; try again.
		s.phase = Unowned
		s.retryAt = m.now + uint64(m.cfg.RetryTicks)
		m.step(p)
		return
	}
	if t.Compare(s.holder.Token) <= 0 {
		// A higher claim arrived while we were claiming: we lost the race
		// unless that claim has since been released.
		s.phase = Unowned
		if !s.holder.Released {
			m.lose(p, s.holder.Token)
		}
		m.step(p)
		return
	}
	s.token = t
	s.holder = Claim{Token: t}
	if !m.wants(p) {
		// The ring moved on while we claimed: give the epoch back.
		s.phase = Unowned
		s.token = Token{}
		s.holder = Claim{Token: t, Released: true}
		m.emit(ActPublish, t, true)
		m.step(p)
		return
	}
	s.phase = Acquiring
	m.emit(ActPublish, t, false)
	m.emit(ActAcquire, t, false)
}

// Acquired feeds the outcome of an ActAcquire: the fence and the handler's
// Acquire. A *StaleTokenError means the resource holds a higher token.
func (m *Machine) Acquired(t Token, err error) {
	s := m.held(t)
	if s == nil || s.phase != Acquiring {
		return
	}
	p := t.Partition
	if err == nil {
		s.phase = Owned
		m.step(p)
		return
	}
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		m.lose(p, stale.Current)
	} else {
		// The handler failed: end the lease, give the claim back, retry.
		m.giveBack(p)
		s.retryAt = m.now + uint64(m.cfg.RetryTicks)
	}
	m.step(p)
}

// Rejected reports that the resource rejected a write under t because it
// holds current: the lease of t is revoked.
func (m *Machine) Rejected(t Token, current Token) {
	if m.held(t) == nil {
		return
	}
	m.lose(t.Partition, current)
	m.step(t.Partition)
}

// Released reports that the handler's Release for t has returned (or
// overran its deadline). The lease ends and the release is published.
func (m *Machine) Released(t Token) {
	if s := m.held(t); s == nil || s.phase != Releasing {
		return
	}
	m.giveBack(t.Partition)
	m.step(t.Partition)
}

// held returns the state of t's partition if t is this node's grant of it
// (Acquiring, Owned or Releasing), and nil otherwise.
func (m *Machine) held(t Token) *part {
	if int(t.Partition) >= len(m.parts) {
		return nil
	}
	s := &m.parts[t.Partition]
	if s.phase < Acquiring || !s.token.Same(t) {
		return nil
	}
	return s
}

// giveBack ends this node's grant of p and publishes its release, so the
// next owner may claim without waiting out a grace period.
func (m *Machine) giveBack(p uint32) {
	s := &m.parts[p]
	m.emit(ActRevoke, s.token, false)
	m.emit(ActPublish, s.token, true)
	s.observe(Claim{Token: s.token, Released: true})
	s.phase = Unowned
	s.token = Token{}
}

// observe raises the highest claim known for the partition to c, if c is
// higher, and reports whether it did.
func (s *part) observe(c Claim) bool {
	if c.Compare(s.holder) <= 0 {
		return false
	}
	s.holder = c
	return true
}

// lose ends this node's grant of p because a higher token exists.
func (m *Machine) lose(p uint32, higher Token) {
	s := &m.parts[p]
	if higher.Compare(s.mark) > 0 {
		s.mark = higher
	}
	s.observe(Claim{Token: higher})
	if s.phase >= Acquiring {
		m.emit(ActRevoke, s.token, false)
	}
	s.phase = Unowned
	s.token = Token{}
	// A live member holds the partition: stay out until the view changes,
	// so two nodes with different views don't fence each other in turn.
	// A dead or former self holds nothing that needs respecting.
	if m.live(higher) {
		s.fencedView = m.view
	}
}

// live reports whether t's owner is another node present in the current
// placement.
func (m *Machine) live(t Token) bool {
	if t.Owner == m.cfg.Self.Name {
		return false // us, or our previous incarnation
	}
	return m.place != nil && m.place.Has(t.Owner)
}

// wants reports whether this node should hold p now.
func (m *Machine) wants(p uint32) bool {
	return m.place != nil && !m.leaving && m.quorum &&
		m.place.Owner(p) == m.cfg.Self.Name
}

func (m *Machine) stepAll() {
	for p := range m.parts {
		m.step(uint32(p))
	}
}

// step moves partition p as far as it can go without new input.
func (m *Machine) step(p uint32) {
	s := &m.parts[p]
	if m.stepDown() && s.phase >= Acquiring {
		// L4: no quorum for too long; stop serving. The release is queued
		// for gossip: it reaches the others after the heal, so a node that
		// claimed the partition meanwhile with a lower epoch learns it is
		// free instead of waiting for this node.
		m.giveBack(p)
		return
	}
	switch s.phase {
	case Owned:
		if !m.wants(p) && m.quorum {
			// Planned move or leave: drain, then release.
			s.phase = Releasing
			m.emit(ActRelease, s.token, false)
		}
	case Unowned:
		if !m.wants(p) {
			s.waitFor = Claim{}
			return
		}
		if s.fencedView == m.view && !s.holder.Released {
			// Fenced out by a live rival: don't contest it until the view
			// changes (L5), unless it has since released the partition.
			return
		}
		s.fencedView = 0
		if m.now < s.retryAt {
			return
		}
		if !m.mayClaim(p) {
			return
		}
		s.phase = Claiming
		seen := s.holder.Token
		if s.mark.Compare(seen) > 0 {
			seen = s.mark
		}
		m.emitClaim(p, seen)
	}
}

// stepDown reports whether the quorum has been missing long enough to
// revoke every lease.
func (m *Machine) stepDown() bool {
	return !m.quorum && m.noQuorum >= m.cfg.StepDownTicks
}

// mayClaim decides, for an unowned partition the ring assigns here, whether
// the current holder (if any) lets us claim now.
func (m *Machine) mayClaim(p uint32) bool {
	s := &m.parts[p]
	h := s.holder
	if h.Token.IsZero() || h.Released || h.Token.Owner == m.cfg.Self.Name {
		s.waitFor = Claim{}
		return true
	}
	if s.waitFor != h {
		s.waitFor, s.waitSince = h, m.now
	}
	waited := m.now - s.waitSince
	if m.live(h.Token) {
		// A planned move: the holder releases when it sees the same ring.
		if m.cfg.HandoffTicks == 0 || waited < uint64(m.cfg.HandoffTicks) {
			return false
		}
	} else if waited < uint64(m.cfg.GraceTicks) {
		// The holder left without a release: give it the grace period.
		return false
	}
	s.waitFor = Claim{}
	return true
}

func (m *Machine) emit(k ActionKind, t Token, released bool) {
	m.out = append(m.out, Action{Kind: k, Partition: t.Partition, Token: t, Released: released})
}

func (m *Machine) emitClaim(p uint32, seen Token) {
	seen.Partition = p
	m.out = append(m.out, Action{Kind: ActClaim, Partition: p, Token: seen})
}
