package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tenure-go/tenure/internal/reach"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
)

// The loop is a pump: one goroutine feeds the ownership state machine
// every input (membership, gossip, worker results, reports, ticks) and
// performs the actions it returns, in order. It decides nothing the
// machine could decide. Slow work (authority, fence, handler, joins) runs
// on worker goroutines that report back through inputs.

// heard is what gossip brought: claims and a stable membership.
type heard struct {
	claims []gossip.Claim
	stable quorum.Stable
}

// inbox queues what memberlist's delegate callbacks hand over, without
// blocking them; the loop drains it.
type inbox struct {
	mu     sync.Mutex
	items  []heard
	signal chan struct{} // cap 1
}

func (q *inbox) push(h heard) {
	q.mu.Lock()
	q.items = append(q.items, h)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *inbox) drain() []heard {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// inputKind says which machine input an input feeds.
type inputKind uint8

const (
	inClaimed   inputKind = iota + 1 // a worker's Authority.Claim
	inFenced                         // a worker's Fence.Fence
	inAcquired                       // a worker's Handler.Acquire
	inReleased                       // a worker's Handler.Release
	inRejected                       // ReportStale: a write was fenced out
	inNotFenced                      // ReportStale: a write found the mark below its token
	inResign                         // Resign
	inEnded                          // a lease's context ended outside the loop (Lease.End)
	inJoined                         // a rejoin finished
	inReached                        // a reach check finished
)

// input is a result of work done off the loop, or a report from a caller.
type input struct {
	kind      inputKind
	partition uint32
	token     ownership.Token
	current   ownership.Token // inRejected: the resource's mark
	err       error
	done      chan error  // inResign: the answer
	reach     reachResult // inReached: who answered
	at        time.Time   // inReached: when the check started
}

// loop owns the state machine and the lease registry.
type loop struct {
	c       *Coordinator
	m       *machine.Machine
	leases  *registry
	workers sync.WaitGroup
	known   map[string]knownMember // for rejoin
	rnd     *rand.Rand             // rejoin's choice of addresses
	names   []string               // the current table's members, sorted
	leavers map[string]bool        // members seen leaving
	joining bool                   // a rejoin is in flight
	idle    bool                   // idleCh closed
	warned  bool                   // the no-quorum warning was logged
	lostAt  time.Time              // when the quorum was last lost

	reach   *reach.Check // the reach check's policy and evidence
	unreach []string     // the members the current view marks Unreachable
	unheard []string     // the members of the current view this node has no word from (reach.Unvouched)
	tickAt  time.Time    // when the loop ran the last tick
	health  func() int   // memberlist's health score; tests set it
}

// syncByStateAfter is how many asks for a stable membership go as stable
// asks before the next is a push/pull of whole states (loop.sync).
const syncByStateAfter = 2

// rejoinFanout is how many addresses one rejoin joins at most.
const rejoinFanout = 2

// knownMember is a member once seen, for rejoin after a partition heals.
type knownMember struct {
	addr string
	// missingSince: when the view last lost the member (zero while it is
	// in the view). Rejoins start rejoinAfter later and stop
	// ReconnectTimeout later.
	missingSince time.Time
}

// machineConfig is the machine's configuration: Config's, with the
// coordinator's register as the machine's record of claims (the delegate
// gossips it).
func (c *Coordinator) machineConfig() machine.MachineConfig {
	mc := c.cfg.machineConfig(c.self)
	mc.Register = c.reg
	return mc
}

func newLoop(c *Coordinator, m *machine.Machine) *loop {
	return &loop{
		c:       c,
		m:       m,
		leases:  c.leases,
		known:   make(map[string]knownMember),
		leavers: make(map[string]bool),
		reach:   reach.New(reachConfig(c.cfg, c.cfg.Clock.Now()), rand.New(rand.NewPCG(c.cfg.Rand.Uint64(), c.cfg.Rand.Uint64()))),
		rnd:     rand.New(rand.NewPCG(c.cfg.Rand.Uint64(), c.cfg.Rand.Uint64())),
		lostAt:  c.cfg.Clock.Now(), // a node starts without a quorum
	}
}

func (l *loop) run() {
	c := l.c
	tick, stopTick := c.cfg.Clock.NewTicker(c.cfg.TickInterval)
	defer stopTick()
	rejoin, stopRejoin := c.cfg.Clock.NewTicker(c.cfg.RejoinInterval)
	defer stopRejoin()
	defer l.shutdown()

	// What the join brought in first, then the members: a joining node
	// must know the current holders before the ring tells it to claim.
	// That is the whole register, learnt from members that have it: it is
	// not passed on (at 4096 partitions that was about 12 transmissions of
	// 4096 claims per join, which kept every joiner's broadcast queue
	// busy for tens of seconds and crowded out the claims of the moves).
	l.perform()
	l.heard(c.inbox.drain(), false)
	l.refreshMembers()
	l.perform()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.inbox.signal:
			l.heard(c.inbox.drain(), true)
		case <-c.memberCh:
			l.refreshMembers()
		case in := <-c.inputs:
			l.apply(in)
		case fired := <-tick:
			l.ticked(fired)
			l.m.Tick()
			l.warnQuorum()
			l.maybeReach()
		case <-rejoin:
			l.rejoin()
		case <-c.leaveCh:
			l.m.Leave()
		}
		l.perform()
		l.leases.gc()
		if c.leaving.Load() && !l.idle && l.m.Idle() {
			l.idle = true
			close(c.idleCh)
		}
	}
}

// shutdown ends every lease as a crash would, tells the handler of those
// it had acquired, and waits for the workers.
func (l *loop) shutdown() {
	l.m.Shutdown(errLeaseClosed)
	l.perform()
	l.workers.Wait()
}

// heard feeds what gossip brought to the machine. With relay, a claim the
// machine says is new to this node is broadcast on.
func (l *loop) heard(hs []heard, relay bool) {
	c := l.c
	for _, h := range hs {
		if h.stable.Known() {
			l.m.HeardStable(h.stable)
		}
		for _, cl := range h.claims {
			changed, err := l.m.Heard(cl)
			if err != nil {
				c.log.Warn("refused gossiped claim", "claim", cl, "err", err)
				c.metrics.gossipDropped.Inc()
				continue
			}
			if changed {
				// New to us: pass it on, so claims spread epidemically and
				// not only from their origin.
				if relay {
					c.broadcastClaim(cl)
				}
				l.holderChanged(cl)
			}
		}
	}
}

// holderChanged tells subscribers who holds a partition now.
func (l *loop) holderChanged(cl gossip.Claim) {
	e := Event{Kind: EventHolderChanged, Partition: cl.Token.Partition, Token: cl.Token, Time: l.c.cfg.Clock.Now()}
	if !cl.Released {
		e.Node = cl.Token.Owner
	}
	l.c.subs.publish(e)
}

// refreshMembers reports the live members, as their metadata shows them,
// to the machine: machine.BuildView decides the view, and the ring is
// built over the members it places on.
func (l *loop) refreshMembers() {
	c := l.c
	live, left := c.nodes.snapshot()
	members := make(map[string]ownership.Member)
	var vms []machine.ViewMember
	now := c.cfg.Clock.Now()
	// Leavers first: one that left and came back since the last refresh
	// is live, and known again below.
	for _, name := range left {
		delete(l.known, name)
	}
	for _, e := range live {
		if e.err != nil || c.refusal(e.member.Name, e.meta) != nil {
			continue // refused by the alive delegate; never placed
		}
		members[e.member.Name] = e.member
		l.known[e.member.Name] = knownMember{addr: e.member.GossipAddr}
		vms = append(vms, machine.ViewMember{Name: e.member.Name, Incarnation: e.meta.Incarnation, Stable: e.meta.Stable, Leaving: e.meta.Leaving})
	}
	for name, k := range l.known {
		if _, ok := members[name]; !ok && k.missingSince.IsZero() {
			k.missingSince = now
			l.known[name] = k
		}
	}
	for _, vm := range vms {
		if vm.Name != c.cfg.Name {
			l.reach.Heard(now, reach.Member{Name: vm.Name, Incarnation: vm.Incarnation}, vm.Stable == (quorum.StableID{}))
		}
	}
	l.unreach, l.unheard = l.verdicts(l.reachMembers(members))
	for i := range vms {
		// Hearsay counts for no quorum: see reach.Unvouched.
		vms[i].Unreachable = slices.Contains(l.unreach, vms[i].Name) || slices.Contains(l.unheard, vms[i].Name)
	}
	c.metrics.unreachable.Set(float64(len(l.unreach)))
	for name := range l.leavers {
		if _, ok := members[name]; !ok {
			// A leaver is out of the table already; now it is gone.
			delete(l.leavers, name)
			defer c.subs.publish(Event{Kind: EventMemberLeft, Node: name, Time: now})
		}
	}
	old := c.Table()
	v := &view{table: old, members: members, unreachable: l.unreach, unheard: l.unheard}
	mv := machine.BuildView(vms, left, func(placed []string) machine.Placement {
		if old != nil && slices.Equal(placed, l.names) {
			return old
		}
		var t *ring.Table
		var err error
		if old != nil {
			t, err = old.Rebuild(placed) // the same table, faster
		} else {
			t, err = ring.New(placed, c.cfg.Ring)
		}
		if err != nil {
			c.log.Error("ring rebuild failed; keeping the previous table", "members", len(placed), "err", err)
			if old == nil {
				return nil
			}
			return old
		}
		v.table = t
		l.names = placed
		return t
	})
	// With no member to place on (every one is leaving, this node too),
	// the last table stays for routing: nothing is placed on it any more.
	if v.table != old {
		defer l.published(old, v.table, members) // once the view holds it
	}
	c.view.Store(v)
	c.metrics.members.Set(float64(len(members)))
	if err := l.m.SetView(mv); err != nil {
		c.log.Error("view", "err", err)
	}
}

// published announces the members that entered or left the table. A
// member that left the table but is still a member is leaving (it hands
// its partitions off); EventMemberLeft follows when it is gone.
func (l *loop) published(old, t *ring.Table, members map[string]ownership.Member) {
	c := l.c
	now := c.cfg.Clock.Now()
	for _, n := range t.Members() {
		if !old.Has(n) {
			c.subs.publish(Event{Kind: EventMemberJoined, Node: n, Time: now})
		}
	}
	for _, n := range old.Members() {
		if t.Has(n) {
			continue
		}
		if _, ok := members[n]; ok {
			l.leavers[n] = true
			c.subs.publish(Event{Kind: EventMemberLeaving, Node: n, Time: now})
		} else {
			c.subs.publish(Event{Kind: EventMemberLeft, Node: n, Time: now})
		}
	}
	c.log.Info("membership", "members", t.Len(), "moves", len(ring.Diff(old, t)))
}

// rejoin joins, every RejoinInterval, up to rejoinFanout addresses drawn
// at random from the known members that gossip no longer shows and that
// are due (rejoinDue) and, while one is, the seeds that aren't members, so
// both sides of a healed partition find each other again. One join that gets through is enough:
// memberlist's push/pull hands over the whole member list, and gossip
// does the rest. A member missing for ReconnectTimeout is forgotten. One
// rejoin runs at a time.
//
// A member is re-joined only once it has been missing for rejoinAfter:
// one declared dead by mistake (a busy machine) usually refutes it by
// itself, and at 100 x 4096 in one process, where load made members look
// dead every second, re-joining them at once was 7% of the CPU, every
// join a whole register each way.
//
// A join sends the whole register both ways. Joining every missing member
// every round, as rejoin did, made each node's cost grow with the members
// it missed: at 100 x 4096 in one process, where load made members look
// dead, thousands of whole registers went out during one node's start
// (issue 22). And a member is re-joined at first only by the few members
// rejoinDue draws for it, not by every node that lost it.
func (l *loop) rejoin() {
	c := l.c
	if l.joining || c.leaving.Load() {
		return
	}
	now := c.cfg.Clock.Now()
	t := c.Table()
	v := c.view.Load()
	var addrs []string
	for name, k := range l.known {
		if _, ok := v.members[name]; ok || t.Has(name) {
			continue
		}
		if k.missingSince.IsZero() {
			continue // not lost yet, by the last refresh
		}
		// From the loss, not from the last refresh that saw the member:
		// after a quiet spell longer than ReconnectTimeout, that refresh is
		// long past, and the member was forgotten unjoined.
		if now.Sub(k.missingSince) > c.cfg.ReconnectTimeout {
			delete(l.known, name)
			continue
		}
		if now.Sub(k.missingSince) < rejoinAfter(c.cfg) {
			continue // it may refute its death by itself
		}
		if !rejoinDue(c.cfg, name, now.Sub(k.missingSince), v.members) {
			continue // a member drawn before this node joins it first
		}
		addrs = append(addrs, k.addr)
	}
	if len(addrs) == 0 {
		return
	}
	live := make(map[string]bool, len(v.members))
	for _, m := range v.members {
		live[m.GossipAddr] = true
	}
	for _, s := range c.cfg.Seeds {
		if !live[s] {
			addrs = append(addrs, s)
		}
	}
	slices.Sort(addrs) // map order is not the seeded draw's
	addrs = slices.Compact(addrs)
	l.rnd.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	addrs = addrs[:min(len(addrs), rejoinFanout)]
	l.joining = true
	c.metrics.rejoins.Inc()
	l.goWork(func() input {
		if n, err := c.ml.Join(addrs); err != nil {
			c.log.Debug("rejoin", "addrs", len(addrs), "joined", n, "err", err)
		}
		return input{kind: inJoined}
	})
}

// rejoinDue says whether this node re-joins lost, missing for missing
// (at least rejoinAfter), now. In its first RejoinInterval past
// rejoinAfter only about log2(members) live members re-join it (at least
// rejoinFanout), the first in an order drawn for lost from the members'
// names (rejoinRank), so the same few on every node whose view agrees;
// each interval it stays missing, twice as many. One join that gets
// through brings lost back for every node, and each join sends the whole
// register both ways: at 100 x 4096 in one process, where load made
// members look dead, every node re-joining each of them sent hundreds of
// registers during one node's start (issue 22). Doubling has every live
// member try within log2(members/first) more intervals (4 at 100
// members), for a split that only some members can see across, or whose
// first few are leaving or stuck in a join.
func rejoinDue(cfg Config, lost string, missing time.Duration, live map[string]ownership.Member) bool {
	allowed := max(rejoinFanout, bits.Len(uint(len(live))))
	if every := cfg.RejoinInterval; every > 0 {
		allowed <<= min(max(missing-rejoinAfter(cfg), 0)/every, 20)
	}
	if allowed >= len(live) {
		return true // every member may: no need to draw
	}
	mine := rejoinRank(lost, cfg.Name)
	ahead := 0
	for name := range live {
		if name != cfg.Name && rejoinRank(lost, name) < mine {
			if ahead++; ahead >= allowed {
				return false
			}
		}
	}
	return true
}

// rejoinRank is member's place in the order drawn for re-joining lost: a
// hash of the two names, the same on every node.
func rejoinRank(lost, member string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(lost)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(member)
	return d.Sum64()
}

// rejoinAfter is how long a member must have been missing from this
// node's view before rejoin joins it: two RejoinIntervals, or memberlist's
// GossipToTheDeadTime if shorter (past it, memberlist sends a dead member
// nothing, so a member declared dead by mistake can no longer learn it and
// refute it). A split that heals sooner is joined up again about
// rejoinAfter plus a RejoinInterval after this node declared the far side
// dead, by the members drawn first (rejoinDue); if none of them can reach
// across, up to log2(members) intervals later.
func rejoinAfter(cfg Config) time.Duration {
	return min(2*cfg.RejoinInterval, cfg.Memberlist.GossipToTheDeadTime)
}

// apply feeds one input to the machine.
func (l *loop) apply(in input) {
	c := l.c
	switch in.kind {
	case inClaimed:
		if in.err != nil {
			if errors.Is(in.err, ownership.ErrConflict) {
				c.log.Debug("claim lost", "partition", in.partition, "err", in.err)
			} else {
				c.log.Warn("claim failed", "partition", in.partition, "err", in.err)
			}
		}
		l.m.Claimed(in.partition, in.token, in.err)
	case inFenced:
		l.workerDone(in.token)
		if in.err != nil && !errors.Is(in.err, ownership.ErrStaleToken) {
			c.log.Warn("fence failed", "token", in.token, "err", in.err)
		}
		l.m.Fenced(in.token, in.err)
	case inAcquired:
		l.workerDone(in.token)
		if in.err != nil && !errors.Is(in.err, ownership.ErrStaleToken) && !errors.Is(in.err, ownership.ErrLeaseEnded) {
			c.log.Warn("acquire failed", "token", in.token, "err", in.err)
		}
		l.m.Acquired(in.token, in.err)
	case inReleased:
		l.workerDone(in.token)
		l.m.Released(in.token)
	case inRejected:
		l.m.Rejected(in.token, in.current)
	case inNotFenced:
		c.log.Warn("the resource lost its fence; ending the lease", "token", in.token)
		l.m.NotFenced(in.token)
	case inResign:
		// The machine decides whether the lease may be resigned.
		_, tok := l.m.Phase(in.partition)
		in.done <- l.m.Resign(tok, false)
	case inEnded:
		if e := l.leases.get(in.token); e != nil && !e.ended {
			// A handler ended its lease itself: that is a resignation.
			l.leases.unserve(in.token)
			l.leases.markEnded(in.token, e)
			l.m.Resign(in.token, true)
		}
	case inJoined:
		l.joining = false
	case inReached:
		l.reached(in.reach, in.at)
	}
}

func (l *loop) workerDone(t ownership.Token) {
	if e := l.leases.get(t); e != nil {
		e.workers--
	}
}

// perform carries out the machine's actions in order.
func (l *loop) perform() {
	c := l.c
	defer l.noteQuorumState()
	for _, a := range l.m.Ready() {
		switch a.Kind {
		case machine.ActClaim:
			c.metrics.claims.Inc()
			l.goClaim(a.Partition, a.Token)
		case machine.ActFence:
			l.goFence(l.leases.start(a.Token))
		case machine.ActAcquire:
			l.goAcquire(l.leases.start(a.Token))
		case machine.ActServe:
			l.serve(a)
		case machine.ActRelease:
			if e := l.leases.get(a.Token); e != nil {
				if a.Cause == nil {
					l.leases.unserve(a.Token)
				}
				l.goRelease(e, a.Cause)
			}
		case machine.ActEnd:
			if l.leases.end(a.Token, a.Cause) {
				now := c.cfg.Clock.Now()
				c.log.Debug("lease ended", "token", a.Token, "cause", causeText(a.Cause))
				c.subs.publish(Event{Kind: EventLeaseEnded, Node: c.cfg.Name, Partition: a.Partition, Token: a.Token, Time: now, Cause: a.Cause})
			}
		case machine.ActPublish:
			cl := gossip.Claim{Token: a.Token, Released: a.Released}
			if a.New { // the machine has recorded it
				l.holderChanged(cl)
			}
			c.broadcastClaim(cl)
			if a.Released {
				c.metrics.releases.Inc()
			}
		case machine.ActStable:
			l.stable(a.Stable)
		case machine.ActShow:
			l.show(a.Stable)
		case machine.ActSync:
			l.sync(a.Node, a.Tries)
		case machine.ActQuorum:
			l.quorum(a.OK)
		}
	}
}

// serve lets callers have a fenced, acquired lease.
func (l *loop) serve(a machine.Action) {
	c := l.c
	if l.leases.serve(a.Token) == nil {
		return
	}
	waited := time.Duration(a.Waited) * c.cfg.TickInterval
	if a.Failover {
		c.metrics.failover.Observe(waited.Seconds())
	} else if a.Waited > 0 {
		c.metrics.handoff.Observe(waited.Seconds())
	}
	now := c.cfg.Clock.Now()
	c.subs.publish(Event{Kind: EventAcquired, Node: c.cfg.Name, Partition: a.Partition, Token: a.Token, Time: now})
}

// stable keeps a new stable membership for gossip: in push/pull state and
// in a broadcast. Metadata shows it when the machine says (show).
func (l *loop) stable(s quorum.Stable) {
	c := l.c
	c.stable.Store(&s)
	c.broadcastStable(s)
}

// show puts s's ID in this node's metadata, so that members whose own
// stable membership is older see that they are outdated. Each update of
// the metadata is an alive message that every member handles and passes
// on: the machine shows a burst of changes as its latest (ShowTicks).
func (l *loop) show(s quorum.Stable) {
	c := l.c
	if err := c.updateMeta(func(m *meta) { m.Stable = s.ID() }); err != nil {
		c.log.Error("node metadata", "err", err)
		return
	}
	l.goUpdateNode()
}

// sync asks member name, which holds a newer stable membership than this
// node, for it: a stable ask (gossip.KindAskStable, a message to name
// alone carrying this node's own), which name answers with its own. It
// was a push/pull, and a join's push/pull carries the whole register both
// ways: at 100 x 4096 in one process, where each start changes the stable
// membership and a busy machine delays its gossip, the syncs of one start
// exchanged up to 2,400 registers, 37 MB (issue 22). A node with no
// stable membership, one starting, still pulls the whole state, and so
// does one whose first syncByStateAfter asks for a stable membership
// (tries before this one) did not bring it up to date.
func (l *loop) sync(name string, tries int) {
	c := l.c
	m, ok := c.view.Load().members[name]
	if !ok {
		return
	}
	c.traffic.syncs.Add(1)
	if own := *c.stable.Load(); own.Version > 0 && tries < syncByStateAfter {
		l.goWork(func() input {
			if err := c.sendStable(name, gossip.KindAskStable, own); err != nil {
				c.log.Debug("stable ask", "member", name, "err", err)
			}
			return input{}
		})
		return
	}
	c.traffic.stateSyncs.Add(1)
	l.goWork(func() input {
		if _, err := c.ml.Join([]string{m.GossipAddr}); err != nil {
			c.log.Debug("sync", "member", name, "err", err)
		}
		return input{}
	})
}

// quorum records a change of quorum. A loss is logged at debug: a node
// that sees a member with a newer stable membership has none until it has
// caught up, which is a moment in every join. warnQuorum says it at WARN
// once it has lasted StepDown.
func (l *loop) quorum(ok bool) {
	c := l.c
	c.quorumOK.Store(ok)
	st := l.m.Stable()
	if ok {
		if l.warned {
			c.log.Info("quorum regained", "stable", st.Members, "stable_version", st.Version)
		}
		l.warned = false
		return
	}
	l.lostAt = c.cfg.Clock.Now()
	c.log.Debug("no quorum", "stable", st.Members, "stable_version", st.Version, "sees", l.viewNames(), "unreachable", l.unreach, "unheard", l.unheard)
}

// noteQuorumState publishes the quorum and why this node counts none, for
// Status, when they changed. One pointer holds both, so Status never
// pairs a quorum with another moment's reason.
func (l *loop) noteQuorumState() {
	qs, st := l.m.QuorumState(), l.m.Stable()
	// Compared by version and names, not by ID: every perform runs this,
	// and an ID hashes every name.
	if last := l.c.quorumNote.Load(); last != nil && qs == last.qs && st.Version == last.stable.Version && slices.Equal(st.Members, last.stable.Members) {
		return
	}
	l.c.quorumNote.Store(&quorumNote{qs: qs, why: noQuorumReason(qs), stable: st})
}

// quorumNote is the quorum as Status shows it, with the stable membership
// it was counted against.
type quorumNote struct {
	qs     machine.QuorumState
	why    string // "" when qs.OK
	stable quorum.Stable
}

// noQuorumReason says why a node in state qs counts no quorum, "" if it
// counts one.
func noQuorumReason(qs machine.QuorumState) string {
	switch {
	case qs.OK:
		return ""
	case qs.Min > 0:
		return fmt.Sprintf("reaches %s, fewer than MinQuorum (%d)", nMembers(qs.Members), qs.Min)
	case qs.Stable == 0 && qs.Outdated:
		return "no stable membership yet: asking a member that shows one"
	case qs.Stable == 0:
		return "no stable membership yet"
	case qs.Outdated:
		return "outdated: a member shows a newer stable membership, which this node is asking for"
	case qs.Doubt:
		return "in doubt: it heard a newer stable membership of which it knows no quorum"
	case qs.Members > qs.Reached:
		return fmt.Sprintf("reaches %d of the %d stable members, not a majority (and %s outside it)", qs.Reached, qs.Stable, nMembers(qs.Members-qs.Reached))
	default:
		return fmt.Sprintf("reaches %d of the %d stable members, not a majority", qs.Reached, qs.Stable)
	}
}

// nMembers is "1 member" or "n members".
func nMembers(n int) string {
	if n == 1 {
		return "1 member"
	}
	return fmt.Sprintf("%d members", n)
}

// warnQuorum logs, once per loss, a quorum missing for StepDown (the
// leases have ended), with what this node counts against.
func (l *loop) warnQuorum() {
	c := l.c
	if l.warned || c.quorumOK.Load() || c.leaving.Load() || c.cfg.Clock.Now().Sub(l.lostAt) < c.cfg.StepDown {
		return
	}
	why := noQuorumReason(l.m.QuorumState())
	if why == "" {
		return // the tick that ran just now brought it back
	}
	l.warned = true
	st := l.m.Stable()
	c.log.Warn("no quorum for StepDown: leases ended; claiming nothing until a quorum of the stable membership is seen",
		"why", why, "stable", st.Members, "stable_version", st.Version, "sees", l.viewNames(), "unreachable", l.unreach, "unheard", l.unheard, "step_down", c.cfg.StepDown)
}

func (l *loop) viewNames() []string {
	v := l.c.view.Load()
	if v == nil {
		return nil
	}
	out := make([]string, 0, len(v.members))
	for n := range v.members {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// goWork runs fn on a worker goroutine and feeds its result to the loop.
func (l *loop) goWork(fn func() input) {
	l.workers.Add(1)
	go func() {
		defer l.workers.Done()
		l.send(fn())
	}()
}

func (l *loop) goClaim(p uint32, seen ownership.Token) {
	c := l.c
	l.goWork(func() input {
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.AcquireTimeout)
		defer cancel()
		tok, err := c.auth.Claim(ctx, p, c.self, seen)
		if err == nil && c.cfg.TokenKeys != nil && tok.MAC == ([ownership.MACSize]byte{}) {
			tok = c.cfg.TokenKeys.Sign(tok)
		}
		return input{kind: inClaimed, partition: p, token: tok, err: err}
	})
}

func (l *loop) goFence(e *leaseEntry) {
	c := l.c
	e.workers++
	lease := e.lease
	l.goWork(func() input {
		ctx, cancel := context.WithTimeout(lease.Context(), c.cfg.AcquireTimeout)
		defer cancel()
		_, err := c.cfg.Fence.Fence(ctx, lease.Token())
		return input{kind: inFenced, token: lease.Token(), err: c.vetStale(lease.Token(), err)}
	})
}

func (l *loop) goAcquire(e *leaseEntry) {
	c := l.c
	e.workers++
	lease := e.lease
	l.goWork(func() input {
		ctx, cancel := context.WithTimeout(lease.Context(), c.cfg.AcquireTimeout)
		defer cancel()
		var err error
		c.calls.run(func() { err = c.cfg.Handler.Acquire(ctx, lease) })
		if err == nil && c.ctx.Err() != nil {
			// Closing: the loop takes no more input, so tell the handler
			// here that the lease it just acquired has ended.
			l.release(lease)
		}
		return input{kind: inAcquired, token: lease.Token(), err: c.vetStale(lease.Token(), err)}
	})
}

func (l *loop) goRelease(e *leaseEntry, cause error) {
	c := l.c
	e.workers++
	lease := e.lease
	l.goWork(func() input {
		parent := c.ctx
		if cause != nil {
			// Cleanup after the lease ended: let it run even at Close.
			parent = context.Background()
		}
		ctx, cancel := context.WithTimeout(parent, c.cfg.ReleaseTimeout)
		defer cancel()
		var err error
		c.calls.run(func() { err = c.cfg.Handler.Release(ctx, lease) })
		if err != nil {
			c.log.Warn("release", "token", lease.Token(), "err", err)
		}
		return input{kind: inReleased, token: lease.Token()}
	})
}

// release calls the handler's Release for an ended lease, bounded by
// ReleaseTimeout.
func (l *loop) release(lease *ownership.Lease) {
	c := l.c
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ReleaseTimeout)
	defer cancel()
	var err error
	c.calls.run(func() { err = c.cfg.Handler.Release(ctx, lease) })
	if err != nil {
		c.log.Warn("release", "token", lease.Token(), "err", err)
	}
}

func (l *loop) goUpdateNode() {
	c := l.c
	l.goWork(func() input {
		if err := c.pushMeta(); err != nil {
			c.log.Debug("update node metadata", "err", err)
		}
		return input{} // nothing to feed
	})
}

// send hands an input to the loop unless the coordinator is closing.
func (l *loop) send(in input) {
	if in.kind == 0 {
		return
	}
	select {
	case l.c.inputs <- in:
	case <-l.c.ctx.Done():
	}
}

// causeText is a lease end's cause without the common prefix.
func causeText(err error) string {
	if err == nil {
		return "released"
	}
	s := err.Error()
	if p := ownership.ErrLeaseEnded.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
