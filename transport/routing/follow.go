package routing

import (
	"time"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// The follower keeps the calls in flight in step with the local
// coordinator's view, as its events report changes:
//
//   - an attempt at a member that left the membership is cancelled at once,
//     and the member's connection is closed;
//   - an attempt at a member whose key's partition another node now holds
//     (the view names another owner, and that owner's claim) is cancelled
//     once that has lasted MoveGrace;
//   - a call pausing before a retry is woken when its partition gets a new
//     holder, or when the owner the view names for its key changes.
//
// A membership event (joined, leaving, left) makes it check every attempt
// and pause; a holder's event (EventHolderChanged, EventAcquired) those of
// the event's partition. It checks everything when events may have been
// dropped (the channel was full), and, when Membership gives no events at
// all, every FollowInterval. Nothing else wakes it but MoveGrace's timer.

// departedTTL is how long the router remembers a member's address after
// the member left, to refuse attempts chosen from an older view.
const departedTTL = time.Minute

// changes is what the events of one batch may have changed.
type changes struct {
	members bool // the membership: check every attempt and pause
	all     bool // anything (events dropped, or none given): check everything
	// parts are the partitions a holder's event named; true for a claim or
	// this node's new lease (which wakes the pauses of the partition).
	parts map[uint32]bool
}

func (ch *changes) add(e coordinator.Event) {
	switch e.Kind {
	case coordinator.EventMemberJoined, coordinator.EventMemberLeft, coordinator.EventMemberLeaving, coordinator.EventLeaving:
		ch.members = true
	case coordinator.EventHolderChanged, coordinator.EventAcquired:
		if ch.parts == nil {
			ch.parts = map[uint32]bool{}
		}
		ch.parts[e.Partition] = ch.parts[e.Partition] || e.Node != ""
	}
}

// follow is the router's follower goroutine. It ends at Close.
func (r *Router) follow(events <-chan coordinator.Event) {
	defer r.wg.Done()
	var tick <-chan time.Time
	if events == nil {
		t := time.NewTicker(r.cfg.FollowInterval)
		defer t.Stop()
		tick = t.C
	}
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	for {
		var ch changes
		select {
		case e, ok := <-events:
			if !ok {
				events = nil // the coordinator closed; its last view still answers
				continue
			}
			ch.add(e)
			// Events are dropped only while the channel is full; a receive
			// that finds it full (or filled again) may follow a drop.
			ch.all = len(events) >= cap(events)-1
			for range len(events) {
				ch.add(<-events)
			}
		case <-tick:
			ch.members, ch.all = true, true
		case <-grace.C:
		case <-r.poke:
		case <-r.quit:
			return
		}
		if ch.all {
			ch.members = true
		}
		if d, ok := r.check(ch); ok {
			grace.Reset(d)
		}
	}
}

// check applies ch to the calls in flight and to the pauses, and returns
// when the next MoveGrace ends, if one is running.
func (r *Router) check(ch changes) (next time.Duration, arm bool) {
	var doomed []*grpc.ClientConn
	if ch.members {
		doomed = r.refreshMembers()
	}
	r.inflightMu.Lock()
	r.gen.Add(1) // see begin: attempts registered from now on see this check's view
	attempts := make([]*attempt, 0, len(r.inflight))
	for a := range r.inflight {
		attempts = append(attempts, a)
	}
	type paused struct {
		w    *waiter
		seen ownerView
	}
	waiters := make([]paused, 0, len(r.waiting))
	for w := range r.waiting {
		waiters = append(waiters, paused{w, w.seen})
	}
	r.inflightMu.Unlock()

	events := ch.members || ch.all || len(ch.parts) > 0
	for _, p := range waiters {
		w := p.w
		claimed := ch.parts[w.partition]
		if !w.woke && (claimed || (events && !w.located) || ((ch.members || ch.all) && r.view(w.key) != p.seen)) {
			w.woke = true
			close(w.wake)
		}
	}
	departed := *r.departed.Load()
	now := time.Now()
	for _, a := range attempts {
		if a.ctx.Err() != nil {
			continue
		}
		if _, ok := departed[a.addr]; ok {
			r.cancel(a, "left the membership")
			continue
		}
		if a.node == "" {
			continue
		}
		if _, named := ch.parts[a.partition]; named || ch.members || ch.all {
			if _, stale := r.stale(a); stale {
				a.movedAt.CompareAndSwap(0, now.UnixNano())
			} else {
				a.movedAt.Store(0)
			}
		}
		m := a.movedAt.Load()
		if m == 0 {
			continue
		}
		if left := r.cfg.MoveGrace - now.Sub(time.Unix(0, m)); left > 0 {
			if !arm || left < next {
				next, arm = left, true
			}
			continue
		}
		if owner, stale := r.stale(a); stale {
			r.cancel(a, "lost the partition to "+owner)
		} else {
			a.movedAt.Store(0)
		}
	}
	for _, cc := range doomed {
		_ = cc.Close()
	}
	return next, arm
}

// refreshMembers reads the members, remembers the addresses of those that
// left, and forgets their connections, which it returns for closing once
// the attempts at them are cancelled.
func (r *Router) refreshMembers() []*grpc.ClientConn {
	live := map[string]string{}
	for _, m := range r.cfg.Membership.Members() {
		if m.ServiceAddr != "" {
			live[m.ServiceAddr] = m.Name
		}
	}
	now := time.Now()
	departed := map[string]time.Time{}
	for addr, at := range *r.departed.Load() {
		if _, back := live[addr]; !back && now.Sub(at) < departedTTL {
			departed[addr] = at
		}
	}
	var gone []string
	for addr := range r.live {
		if _, ok := live[addr]; !ok {
			departed[addr] = now
			gone = append(gone, addr)
		}
	}
	r.live = live

	// Under r.mu, so that Conn refuses a departed address from now on and
	// no connection to one is dialed after this.
	r.mu.Lock()
	defer r.mu.Unlock()
	r.departed.Store(&departed)
	if len(gone) == 0 {
		return nil
	}
	old := *r.conns.Load()
	next := make(map[string]*grpc.ClientConn, len(old))
	for a, c := range old {
		next[a] = c
	}
	var doomed []*grpc.ClientConn
	for _, a := range gone {
		if c, ok := next[a]; ok {
			doomed = append(doomed, c)
			delete(next, a)
		}
	}
	r.conns.Store(&next)
	return doomed
}

// ownerView is what Owners says of a key: the owner, and its claim's token
// (zero until the owner's claim is heard).
type ownerView struct {
	node  string
	token ownership.Token
}

// view returns what Owners says of key now (the zero view on an error).
func (r *Router) view(key []byte) ownerView {
	o, err := r.cfg.Owners.Owner(key)
	if err != nil {
		return ownerView{}
	}
	return ownerView{node: o.Node, token: o.Token}
}

// stale reports whether a's node no longer holds a's key's partition, as
// the view says: another node owns it and holds its claim. It returns
// that node.
func (r *Router) stale(a *attempt) (owner string, stale bool) {
	o, err := r.cfg.Owners.Owner(a.key)
	if err != nil || o.Node == a.node || o.Token.IsZero() {
		return "", false
	}
	return o.Node, true
}

// cancel cancels a, whose node left or lost the partition (why).
func (r *Router) cancel(a *attempt, why string) {
	r.cancelled.Add(1)
	a.cancel(&ownerGoneError{addr: a.addr, node: a.node, why: why})
}

// recheck checks a as the follower would have: the follower checked the
// calls in flight after a's target was chosen and before a was registered.
func (r *Router) recheck(a *attempt) {
	if _, ok := (*r.departed.Load())[a.addr]; ok {
		r.cancel(a, "left the membership")
		return
	}
	if a.node == "" {
		return
	}
	if _, stale := r.stale(a); stale && a.movedAt.CompareAndSwap(0, time.Now().UnixNano()) {
		select {
		case r.poke <- struct{}{}: // the follower arms MoveGrace's timer
		default:
		}
	}
}
