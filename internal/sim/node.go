package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/tenure-go/tenure/internal/reach"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// cluster is the simulated cluster's name.
const cluster = "sim"

// node is one simulated process: the real machine, register and gossip
// authority, and a shell modelled on the coordinator's loop.
type node struct {
	s    *Sim
	idx  int
	name string

	up       bool // a process exists: not crashed, not departed
	departed bool
	paused   bool
	life     int      // bumped by every crash and restart
	backlog  []func() // inputs that arrived while paused
	self     ownership.Node
	m        *machine.Machine
	reg      *gossip.Register
	auth     *gossip.Authority
	stable   quorum.Stable
	stableID quorum.StableID // stable's ID (hashing the names costs)
	shownID  quorum.StableID // the stable ID its metadata shows (ActShow)
	leaving  bool
	leftAt   uint64 // tick the leave started
	founder  bool   // this life bootstrapped the cluster
	rooted   bool   // its stable membership is of the cluster's lineage (see checker.adopted)
	skew     int    // 0 normal, 1 fast (two ticks a tick), -1 slow (one every other)
	// servedTok is the lease callers may have, per partition (zero: none).
	servedTok []ownership.Token
	// acquired: tokens whose Acquire succeeded and whose Release has not
	// been called yet (the handler contract).
	acquired map[ownership.Token]bool
	// calls is the handler call last started per partition, for the
	// contract that calls for one partition never overlap unless one
	// overran its deadline.
	calls []*handlerCall
	// overran: tokens whose Acquire returned after its deadline; the
	// Release that cleans one up is the tail of an abandoned call.
	overran map[ownership.Token]bool
	ticks   uint64 // the machine's ticks this life
	// The reach check (reach.go): its policy, the round in flight, when
	// the loop last ran, and until when it lags (the late fault).
	rc        *reach.Check
	round     *reachRound
	ranAt     time.Time
	lateUntil uint64
	sc        *scaleNode // the scale mode's part, or nil
}

// handlerCall is an Acquire or a Release in progress.
type handlerCall struct {
	what     string
	start    uint64 // machine tick it started
	deadline uint64 // AcquireTicks or ReleaseTicks
	running  bool
}

func key(t ownership.Token) ownership.Token {
	t.MAC = [ownership.MACSize]byte{}
	return t
}

// start starts a new life of the node.
func (n *node) start(bootstrap bool) {
	s := n.s
	prev := n.self.Incarnation
	n.up, n.departed, n.paused, n.leaving, n.skew = true, false, false, false, 0
	n.life++
	n.backlog = nil
	n.self = ownership.Node{Name: n.name, Incarnation: s.incarnation()}
	if s.cfg.Bugs.ReuseIncarnation && prev != 0 {
		n.self.Incarnation = prev
	}
	n.founder, n.rooted = bootstrap, false
	n.reg, _ = gossip.NewRegister(s.cfg.Partitions)
	if s.scale != nil {
		n.sc = newScaleNode(s.cfg.Partitions)
	}
	n.auth, _ = gossip.NewAuthority(n.reg, s.keys)
	n.stable, n.stableID, n.shownID = quorum.Stable{}, quorum.StableID{}, quorum.StableID{}
	s.chk.outdated[n.idx] = false
	n.servedTok = make([]ownership.Token, s.cfg.Partitions)
	n.acquired = make(map[ownership.Token]bool)
	n.calls = make([]*handlerCall, s.cfg.Partitions)
	n.overran = make(map[ownership.Token]bool)
	n.ticks = 0
	// The check draws from its own source, so that the schedules' draws
	// don't depend on its.
	rnd := rand.New(rand.NewPCG(s.cfg.Seed, uint64(n.idx)<<32|uint64(n.life)))
	n.rc, n.round, n.ranAt, n.lateUntil = reach.New(s.reachConfig(), rnd), nil, time.Time{}, 0
	c := s.cfg
	knobs := c.Knobs
	m, err := machine.NewMachine(machine.MachineConfig{
		Self: n.self, Partitions: c.Partitions, Bootstrap: bootstrap,
		Fenced: true, StrictAuthority: c.Strict,
		GraceTicks: c.Grace, HandoffTicks: c.Handoff, StepDownTicks: c.StepDown,
		StableAfterTicks: c.StableAfter, ShowTicks: c.Show, RetryTicks: c.Retry, MaxRetryTicks: c.MaxRetry,
		AcquireTicks: c.Acquire, ReleaseTicks: c.Release, MaxClaims: c.maxClaims(),
		Rand: s.rng, Knobs: &knobs, Register: n.reg,
	})
	if err != nil {
		panic(err)
	}
	n.m = m
	s.tracef("%s starts, incarnation %x", n.name, n.self.Incarnation)
	if s.net != nil {
		// A new process knows only itself until it joins; the others see
		// its new incarnation in its metadata.
		for j := range s.nodes {
			s.net.sees[n.idx][j] = j == n.idx
			s.net.flip[n.idx][j] = 0
			s.net.unreach[n.idx][j] = false
		}
		s.net.left[n.idx] = nil
		s.net.metaChanged(n)
	}
	n.perform()
}

// running reports whether the node processes inputs now.
func (n *node) running() bool { return n.up && !n.paused }

func (n *node) served(p uint32) bool { return !n.servedTok[p].IsZero() }

// servesAny reports whether callers may have any lease of the node.
func (n *node) servesAny() bool {
	for _, t := range n.servedTok {
		if !t.IsZero() {
			return true
		}
	}
	return false
}

// input runs fn on the node, in life, as the loop would: later if paused,
// never if the node crashed since.
func (n *node) input(life int, fn func()) {
	if !n.up || n.life != life {
		return
	}
	if n.paused {
		n.backlog = append(n.backlog, fn)
		return
	}
	n.s.Events++
	fn()
	n.perform()
}

// resume ends a pause: the backlog runs in order.
func (n *node) resume() {
	if !n.paused || !n.up {
		return
	}
	n.paused = false
	b := n.backlog
	n.backlog = nil
	for _, fn := range b {
		n.s.Events++
		fn()
		n.perform()
	}
	n.s.net.dirty[n.idx] = true
	n.s.tracef("%s resumes", n.name)
}

// tick is the machine's clock, and the writers.
func (n *node) tick() {
	s := n.s
	if !n.running() {
		return
	}
	ticks := 1
	switch {
	case n.skew > 0:
		ticks = 2
	case n.skew < 0 && s.now%2 == 1:
		ticks = 0
	case n.late():
		ticks = 2 * int(s.now%2) // bunched: none, then two
	}
	for range ticks {
		s.Events++
		n.ticks++
		n.m.Tick()
		n.perform()
	}
	if n.leaving && n.m.Idle() && (n.handedOff() || s.now-n.leftAt >= uint64(s.cfg.Handoff)) {
		n.depart()
		return
	}
	for p, t := range n.servedTok {
		if !t.IsZero() && s.chance(0.3) {
			s.res.write(n, uint32(p), t)
		}
	}
}

// placed returns the members the node's ring places on, as it sees them.
func (n *node) placed() []string {
	members, _ := n.s.net.viewPeek(n.idx)
	return machine.Placed(n.members(members))
}

// members is what the node's shell reports of the members it sees, as
// the coordinator's loop reports them from memberlist's.
func (n *node) members(seen []int) []machine.ViewMember {
	s := n.s
	out := make([]machine.ViewMember, 0, len(seen))
	for _, j := range seen {
		m := s.nodes[j]
		out = append(out, machine.ViewMember{Name: m.name, Incarnation: m.self.Incarnation, Stable: m.shownID, Leaving: m.leaving,
			Unreachable: s.net.unreach[n.idx][j]})
	}
	return out
}

// setView gives the machine the node's current view, built as the
// coordinator's loop builds it.
func (n *node) setView() {
	s := n.s
	members, left := s.net.view(n.idx)
	v := machine.BuildView(n.members(members), left, func(names []string) machine.Placement { return s.table(names) })
	s.Events++
	if err := n.m.SetView(v); err != nil {
		panic(err)
	}
	n.perform()
}

// perform carries out the machine's actions, as the coordinator's loop
// does, with the model's delays.
func (n *node) perform() {
	s := n.s
	life := n.life
	for _, a := range n.m.Ready() {
		switch a.Kind {
		case machine.ActClaim:
			s.tracef("%s claims p%d above %v", n.name, a.Partition, a.Token)
			s.chk.claimed(n, a.Partition)
			n.claim(life, a.Partition, a.Token)
		case machine.ActFence:
			t := a.Token
			s.after(s.between(0, 2), func() {
				_, err := s.res.fence(t)
				s.after(s.between(0, 1), func() { n.input(life, func() { n.m.Fenced(t, err) }) })
			})
		case machine.ActAcquire:
			t := a.Token
			d := s.between(0, 2)
			if s.chance(0.01) {
				d = s.cfg.Acquire + s.between(1, 5) // an Acquire that overruns
			}
			var err error
			if s.chance(0.02) {
				err = errors.New("handler failed")
			}
			call := n.call(a.Partition, "Acquire", s.cfg.Acquire)
			s.after(d, func() {
				call.running = false
				if n.ticks-call.start >= call.deadline {
					n.overran[key(t)] = true
				}
				n.input(life, func() {
					if err == nil {
						n.acquired[key(t)] = true
					}
					n.m.Acquired(t, err)
				})
			})
		case machine.ActServe:
			s.tracef("%s serves %v", n.name, a.Token)
			s.chk.serve(n, a.Token)
			n.servedTok[a.Partition] = a.Token
		case machine.ActRelease:
			t := a.Token
			s.chk.release(n, t)
			if a.Cause == nil {
				n.unserve(t)
			}
			d := s.between(0, 2)
			if s.chance(0.01) {
				d = s.cfg.Release + s.between(1, 5) // a Release that overruns
			}
			call := &handlerCall{}
			if n.overran[key(t)] {
				delete(n.overran, key(t)) // the abandoned call's tail: may overlap
			} else {
				call = n.call(a.Partition, "Release", s.cfg.Release)
			}
			s.after(d, func() { call.running = false; n.input(life, func() { n.m.Released(t) }) })
		case machine.ActEnd:
			s.tracef("%s ends %v (%v)", n.name, a.Token, a.Cause)
			n.unserve(a.Token)
			if errors.Is(a.Cause, ownership.ErrLeaseFailed) || errors.Is(a.Cause, ownership.ErrLeaseTimeout) {
				// The handler's doing, not the protocol's: the duel
				// bound doesn't count the epoch.
				s.chk.epochs[a.Partition]--
			}
		case machine.ActPublish:
			s.tracef("%s publishes %v released=%v", n.name, a.Token, a.Released)
			cl := gossip.Claim{Token: a.Token, Released: a.Released}
			n.observed(cl.Token.Partition) // the machine has recorded it
			n.gossip(gossip.Message{Kind: gossip.KindClaim, Claim: cl})
		case machine.ActStable:
			s.chk.adopted(n, a.Stable)
			n.stable, n.stableID = a.Stable, a.Stable.ID()
			s.tracef("%s stable %v", n.name, a.Stable)
			n.gossip(gossip.Message{Kind: gossip.KindStable, Stable: a.Stable})
		case machine.ActShow:
			n.shownID = a.Stable.ID()
			s.net.metaChanged(n)
		case machine.ActSync:
			if m := s.nodeByName(a.Node); m != nil {
				if s.scale != nil {
					s.scale.cost.Syncs++
				}
				s.net.pushPull(n.idx, m.idx)
			}
		case machine.ActQuorum:
			s.tracef("%s quorum %v (stable %v)", n.name, a.OK, n.m.Stable())
		}
	}
}

// call starts a handler call for partition p, checking that the last one
// returned or overran its deadline.
func (n *node) call(p uint32, what string, deadline int) *handlerCall {
	if prev := n.calls[p]; prev != nil && prev.running && n.ticks-prev.start < prev.deadline {
		n.s.chk.fail("handler: %s of p%d on %s while its %s of %d ticks ago runs", what, p, n.name, prev.what, n.ticks-prev.start)
	}
	c := &handlerCall{what: what, start: n.ticks, deadline: uint64(deadline), running: true}
	n.calls[p] = c
	return c
}

func (n *node) unserve(t ownership.Token) {
	if n.servedTok[t.Partition].Same(t) {
		n.servedTok[t.Partition] = ownership.Token{}
	}
}

// claim asks the authority for a token and feeds the answer back.
func (n *node) claim(life int, p uint32, seen ownership.Token) {
	s := n.s
	s.after(s.between(0, 1), func() {
		var (
			t   ownership.Token
			err error
		)
		if s.cfg.Strict {
			t, err = s.res.claim(p, n.self, seen)
		} else if n.up && n.life == life {
			t, err = n.auth.Claim(context.Background(), p, n.self, seen)
			n.observed(p)
		} else {
			return
		}
		if err == nil {
			t = s.keys.Sign(t)
			s.chk.minted(n, t)
		}
		s.after(s.between(0, 1), func() {
			n.input(life, func() {
				s.tracef("%s claimed p%d: %v %v (holder %v)", n.name, p, t, err, n.m.Holder(p))
				n.m.Claimed(p, t, err)
				ph, tok := n.m.Phase(p)
				s.tracef("%s after claimed p%d: %v %v holder %v", n.name, p, ph, tok, n.m.Holder(p))
			})
		})
	})
}

// gossip broadcasts a message; a stable membership only when its names
// fit in a packet, as the coordinator does (push/pull carries it anyway).
func (n *node) gossip(m gossip.Message) {
	if m.Kind == gossip.KindStable {
		k := 0
		for _, name := range m.Stable.Members {
			k += len(name) + 1
		}
		if k > maxStableBroadcast {
			return
		}
	}
	m.Cluster, m.Sender = cluster, n.name
	b, err := m.Seal(n.s.keys)
	if err != nil {
		panic(err)
	}
	switch {
	case n.s.scale == nil:
		n.s.net.broadcast(n.idx, b)
	case n.s.scale.epidemic:
		n.queueGossip(m, len(b))
	default:
		n.s.net.direct(n.idx, m, len(b))
	}
}

// state returns the node's push/pull state.
func (n *node) state() []byte {
	b, err := gossip.Message{Kind: gossip.KindState, Cluster: cluster, Sender: n.name, Stable: n.stable, Register: n.reg}.Seal(n.s.keys)
	if err != nil {
		panic(err)
	}
	return b
}

// receive is the delegate's NotifyMsg (ch gossip.Broadcast) and
// MergeRemoteState (ch gossip.PushPull). A panic in it is a crash of the
// node's process (memberlist's goroutines recover nothing): the checker
// records it.
func (n *node) receive(life int, ch gossip.Channel, b []byte) {
	n.input(life, func() {
		defer func() {
			if p := recover(); p != nil {
				n.s.chk.fail("crash: %s panicked on a message from the %v channel: %v", n.name, ch, p)
			}
		}()
		s := n.s
		keys := s.keys
		name := cluster
		if s.cfg.Bugs.TrustGossip {
			keys, name = nil, clusterOf(b)
		}
		m, err := gossip.Open(b, ch, name, keys)
		if err != nil && s.cfg.Bugs.AnyKindAsState && ch == gossip.PushPull {
			m, err = gossip.Open(b, gossip.Broadcast, name, keys)
		}
		if err != nil {
			return
		}
		n.take(ch, m)
	})
}

// receiveOpened is receive for the scale mode's messages, opened once
// for every receiver (a packet's pieces, in order).
func (n *node) receiveOpened(life int, ms []gossip.Message) {
	n.input(life, func() {
		for _, m := range ms {
			n.take(gossip.Broadcast, m)
		}
	})
}

// take is what the delegate and the loop do with an opened message: the
// stable membership and each claim to the machine, and a claim the
// machine says is new to the node on to the others (claims spread
// epidemically; the scale mode's formation delivers to every member, so
// nobody relays).
func (n *node) take(ch gossip.Channel, m gossip.Message) {
	s := n.s
	if ch == gossip.PushPull && m.Register.Partitions() != n.reg.Partitions() {
		return // as the shell does
	}
	if m.Stable.Known() {
		n.m.HeardStable(m.Stable)
	}
	relay := s.scale == nil || s.scale.epidemic
	for c := range m.Claims() {
		var changed bool
		if s.cfg.Bugs.TrustGossip {
			// The buggy shell records the claim itself, unchecked (no
			// bound on its epoch), before the machine hears it.
			changed = n.reg.ObserveClaim(c)
			n.m.Heard(c)
		} else {
			var err error
			if changed, err = n.m.Heard(c); err != nil {
				continue
			}
		}
		if changed {
			n.observed(c.Token.Partition)
		}
		if changed && relay && m.Kind == gossip.KindClaim {
			n.gossip(gossip.Message{Kind: gossip.KindClaim, Claim: c})
		}
	}
}

// clusterOf reads the cluster name of an encoded gossip message (for a
// shell that does not check it).
func clusterOf(b []byte) string {
	if len(b) < 5 || len(b) < 5+int(b[4]) {
		return ""
	}
	return string(b[5 : 5+int(b[4])])
}

// reportStale is the coordinator's ReportStale for a write the resource
// refused.
func (n *node) reportStale(err error) {
	var st *ownership.StaleTokenError
	var nf *ownership.NotFencedError
	switch {
	case errors.As(err, &st) && st.Token.Node() == n.self:
		if st.Current.Compare(st.Token) > 0 {
			n.m.Rejected(st.Token, st.Current)
		}
	case errors.As(err, &nf) && nf.Token.Node() == n.self:
		n.m.NotFenced(nf.Token)
	}
}

// crash stops the process: no goodbye, nothing kept.
func (n *node) crash() {
	if !n.up {
		return
	}
	n.up = false
	n.life++
	n.backlog = nil
	n.s.tracef("%s crashes", n.name)
}

// leave starts a graceful leave.
func (n *node) leave() {
	if !n.running() || n.leaving {
		return
	}
	n.leaving, n.leftAt = true, n.s.now
	n.m.Leave()
	n.perform()
	n.s.net.metaChanged(n)
	n.s.tracef("%s leaves", n.name)
}

// handedOff reports whether every partition the node released has a new
// holder it heard of, as the coordinator's Leave waits for (at most
// HandoffTimeout) before it says goodbye.
func (n *node) handedOff() bool {
	for p := range uint32(n.s.cfg.Partitions) {
		if h := n.m.Holder(p); h.Released && h.Token.Owner == n.name {
			return false
		}
	}
	return true
}

// depart ends a graceful leave: the node is gone.
func (n *node) depart() {
	n.up, n.departed = false, true
	n.life++
	n.s.net.departed(n)
	n.s.tracef("%s departed", n.name)
}
