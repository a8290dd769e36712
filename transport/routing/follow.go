package routing

import (
	"time"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
)

// follow is the router's follower: after every membership event, and every
// FollowInterval, it cancels the attempts in flight to members that left or
// lost the key's partition, closes the connections of departed members, and
// wakes the calls pausing before a retry. It ends at Close.
func (r *Router) follow(events <-chan coordinator.Event) {
	defer r.wg.Done()
	tick := time.NewTicker(r.cfg.FollowInterval)
	defer tick.Stop()
	for {
		select {
		case _, ok := <-events:
			if !ok {
				events = nil // the coordinator closed; its last view still answers
				continue
			}
			drain(events)
			r.check()
			r.wake()
		case <-tick.C:
			r.check()
		case <-r.quit:
			return
		}
	}
}

// drain takes the events already queued, so a burst costs one check.
func drain(events <-chan coordinator.Event) {
	for range len(events) {
		<-events
	}
}

// wake ends the pauses of the calls waiting to retry.
func (r *Router) wake() {
	ch := make(chan struct{})
	close(*r.changed.Swap(&ch))
}

// members returns the members' service addresses, each with its name.
func (r *Router) members() *map[string]string {
	live := map[string]string{}
	for _, m := range r.cfg.Membership.Members() {
		if m.ServiceAddr != "" {
			live[m.ServiceAddr] = m.Name
		}
	}
	return &live
}

// check cancels the attempts in flight whose member is gone or whose key's
// partition another node has claimed (after MoveGrace), and closes the
// connections of members that left since the last check.
func (r *Router) check() {
	prev := *r.live.Load()
	live := r.members()
	r.live.Store(live)
	now := time.Now()

	r.inflightMu.Lock()
	attempts := make([]*attempt, 0, len(r.inflight))
	for a := range r.inflight {
		attempts = append(attempts, a)
	}
	waiters := make([]*waiter, 0, len(r.waiting))
	for w := range r.waiting {
		waiters = append(waiters, w)
	}
	r.inflightMu.Unlock()
	for _, w := range waiters {
		if o, err := r.cfg.Owners.Owner(w.key); err == nil && !w.woke && !o.Token.IsZero() && o.Token != w.seen {
			w.woke = true
			close(w.wake)
		}
	}
	for _, a := range attempts {
		if a.ctx.Err() != nil {
			continue
		}
		if _, ok := (*live)[a.addr]; !ok && (a.member || prev[a.addr] != "") {
			r.cancelled.Add(1)
			a.cancel(&ownerGoneError{addr: a.addr, node: a.node, why: "left the membership"})
			continue
		}
		if a.node == "" {
			continue
		}
		o, err := r.cfg.Owners.Owner(a.key)
		if err != nil || o.Node == a.node || o.Token.IsZero() {
			a.movedAt = time.Time{}
			continue
		}
		if a.movedAt.IsZero() {
			a.movedAt = now
		}
		if now.Sub(a.movedAt) >= r.cfg.MoveGrace {
			r.cancelled.Add(1)
			a.cancel(&ownerGoneError{addr: a.addr, node: a.node, why: "lost the partition to " + o.Node})
		}
	}

	var gone []string
	for addr := range prev {
		if _, ok := (*live)[addr]; !ok {
			gone = append(gone, addr)
		}
	}
	if len(gone) > 0 {
		r.closeConns(gone)
	}
}

// closeConns closes and forgets the connections to addrs.
func (r *Router) closeConns(addrs []string) {
	r.mu.Lock()
	old := *r.conns.Load()
	next := make(map[string]*grpc.ClientConn, len(old))
	var doomed []*grpc.ClientConn
	for a, c := range old {
		next[a] = c
	}
	for _, a := range addrs {
		if c, ok := next[a]; ok {
			doomed = append(doomed, c)
			delete(next, a)
		}
	}
	r.conns.Store(&next)
	r.mu.Unlock()
	for _, c := range doomed {
		_ = c.Close()
	}
}
