package coordinator

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

// resultKind says which machine input a result feeds.
type resultKind uint8

const (
	resClaimed resultKind = iota + 1
	resAcquired
	resReleased
	resRejected
)

// result is the outcome of work done off the loop, sent back to it.
type result struct {
	kind      resultKind
	partition uint32
	token     ownership.Token
	current   ownership.Token // resRejected: the resource's mark
	err       error
}

// inbox queues claims heard from gossip. memberlist's delegate callbacks
// push without blocking; the loop drains.
type inbox struct {
	mu     sync.Mutex
	claims []ownership.Claim
	signal chan struct{} // cap 1
}

func (q *inbox) push(cs ...ownership.Claim) {
	if len(cs) == 0 {
		return
	}
	q.mu.Lock()
	q.claims = append(q.claims, cs...)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *inbox) drain() []ownership.Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	cs := q.claims
	q.claims = nil
	return cs
}

// loop owns the state machine: one goroutine feeds it every input and
// performs its actions. Slow work (authority, fence, handler) runs on
// worker goroutines that report back through c.results.
type loop struct {
	c       *Coordinator
	m       *ownership.Machine
	live    map[uint32]*ownership.Lease // leases from Acquire to Revoke
	workers sync.WaitGroup
	quorum  quorum
	known   map[string]string // member name -> gossip address, for rejoin
	names   []string          // the current table's members, sorted
	left    bool              // Leave requested
	idle    bool              // idleCh closed
	// since is when this node started waiting to own a partition the ring
	// gave it, and whether the previous holder left without a release.
	since map[uint32]waitInfo
}

type waitInfo struct {
	at       time.Time
	failover bool
}

func newLoop(c *Coordinator, m *ownership.Machine) *loop {
	return &loop{
		c:     c,
		m:     m,
		live:  make(map[uint32]*ownership.Lease),
		known: make(map[string]string),
		since: make(map[uint32]waitInfo),
		names: []string{c.cfg.Name},
		quorum: quorum{
			min:         c.cfg.MinQuorum,
			stableAfter: c.cfg.StableAfter,
		},
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
	l.heard(c.inbox.drain())
	l.refreshMembers()
	l.perform()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.inbox.signal:
			l.heard(c.inbox.drain())
		case <-c.memberCh:
			l.refreshMembers()
		case r := <-c.results:
			l.apply(r)
		case <-tick:
			l.m.SetQuorum(l.quorum.check(c.cfg.Clock.Now(), l.names))
			l.m.Tick()
		case <-rejoin:
			l.rejoin()
		case <-c.leaveCh:
			l.left = true
			l.m.Leave()
		}
		l.perform()
		if l.left && !l.idle && l.m.Idle() {
			l.idle = true
			close(c.idleCh)
		}
	}
}

// shutdown ends every lease and waits for the workers, which see c.ctx
// cancelled.
func (l *loop) shutdown() {
	for p, lease := range l.live {
		lease.End(ErrClosed)
		l.c.leases[p].Store(nil)
	}
	l.workers.Wait()
}

func (l *loop) heard(cs []ownership.Claim) {
	for _, cl := range cs {
		if int(cl.Token.Partition) >= len(l.c.leases) || cl.Token.IsZero() {
			continue
		}
		if l.c.reg.ObserveClaim(cl) {
			// New to us: pass it on, so claims spread epidemically and not
			// only from their origin.
			l.c.broadcast(cl)
		}
		l.m.Heard(cl)
	}
}

// refreshMembers rebuilds the table from the live members.
func (l *loop) refreshMembers() {
	c := l.c
	members := make(map[string]ownership.Member)
	live, left := c.nodes.snapshot()
	for _, name := range left {
		l.quorum.forget(name)
	}
	for _, e := range live {
		if e.err != nil || c.refusal(e.member.Name, e.meta) != nil {
			continue // refused by the alive delegate; never placed
		}
		members[e.member.Name] = e.member
		l.known[e.member.Name] = e.member.GossipAddr
	}
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	slices.Sort(names)
	old := c.Table()
	if old != nil && slices.Equal(names, l.names) {
		// Same member set, so the same table; addresses may have changed.
		c.view.Store(&view{table: old, members: members})
		return
	}
	if len(names) == 0 {
		// This node has left and sees no one (not even itself): the last
		// table stays, as nothing is placed on it any more.
		return
	}
	t, err := ring.New(names, c.cfg.Ring)
	if err != nil {
		c.log.Error("ring rebuild failed; keeping the previous table", "members", len(names), "err", err)
		return
	}
	var oldNames []string
	if old != nil {
		oldNames = l.names
	}
	l.names = names
	c.view.Store(&view{table: t, members: members})
	now := c.cfg.Clock.Now()
	for _, n := range names {
		if !slices.Contains(oldNames, n) {
			c.subs.publish(Event{Kind: EventMemberJoined, Node: n, Time: now})
		}
	}
	for _, n := range oldNames {
		if !t.Has(n) {
			c.subs.publish(Event{Kind: EventMemberLeft, Node: n, Time: now})
		}
	}
	moves := ring.Diff(old, t)
	for _, mv := range moves {
		if mv.To == c.cfg.Name {
			cl := c.reg.GetClaim(uint32(mv.Partition))
			l.since[uint32(mv.Partition)] = waitInfo{at: now, failover: !cl.Released && cl.Token.Owner != "" && !t.Has(cl.Token.Owner)}
		}
	}
	c.metrics.members.Set(float64(len(names)))
	l.m.SetQuorum(l.quorum.check(now, names))
	if err := l.m.SetPlacement(t); err != nil {
		c.log.Error("placement", "err", err)
	}
	c.log.Info("membership", "members", len(names), "moves", len(moves))
}

// rejoin joins the seeds and every known member that gossip no longer shows,
// so both sides of a healed partition find each other again.
func (l *loop) rejoin() {
	c := l.c
	t := c.Table()
	var addrs []string
	for name, addr := range l.known {
		if t == nil || !t.Has(name) {
			addrs = append(addrs, addr)
		}
	}
	if len(addrs) == 0 {
		return
	}
	addrs = append(addrs, c.cfg.Seeds...)
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	l.workers.Add(1)
	go func() {
		defer l.workers.Done()
		if n, err := c.ml.Join(addrs); err != nil {
			c.log.Debug("rejoin", "addrs", len(addrs), "joined", n, "err", err)
		}
	}()
}

// apply feeds a worker's result to the machine.
func (l *loop) apply(r result) {
	c := l.c
	switch r.kind {
	case resClaimed:
		if r.err != nil {
			c.log.Warn("claim failed", "partition", r.partition, "err", r.err)
		}
		l.m.Claimed(r.partition, r.token, r.err)
	case resAcquired:
		l.m.Acquired(r.token, r.err)
		ph, tok := l.m.Phase(r.token.Partition)
		if r.err != nil {
			c.log.Warn("acquire failed", "token", r.token, "err", r.err)
			return
		}
		if ph >= ownership.Owned && tok.Same(r.token) {
			if lease := l.live[r.token.Partition]; lease != nil {
				c.leases[r.token.Partition].Store(lease)
			}
			now := c.cfg.Clock.Now()
			if w, ok := l.since[r.token.Partition]; ok {
				delete(l.since, r.token.Partition)
				if w.failover {
					c.metrics.failover.Observe(now.Sub(w.at).Seconds())
				} else {
					c.metrics.handoff.Observe(now.Sub(w.at).Seconds())
				}
			}
			c.subs.publish(Event{Kind: EventAcquired, Node: c.cfg.Name, Partition: r.token.Partition, Token: r.token, Time: now})
		}
	case resReleased:
		l.m.Released(r.token)
	case resRejected:
		l.m.Rejected(r.token, r.current)
	}
}

// perform carries out the machine's actions in order.
func (l *loop) perform() {
	c := l.c
	for _, a := range l.m.Ready() {
		switch a.Kind {
		case ownership.ActClaim:
			c.metrics.claims.Inc()
			l.goClaim(a.Partition, a.Token)
		case ownership.ActAcquire:
			lease := ownership.NewLease(c.ctx, a.Token)
			l.live[a.Partition] = lease
			l.goAcquire(lease)
		case ownership.ActRelease:
			if lease := l.live[a.Partition]; lease != nil {
				l.goRelease(lease)
			}
		case ownership.ActPublish:
			cl := ownership.Claim{Token: a.Token, Released: a.Released}
			c.reg.ObserveClaim(cl)
			c.broadcast(cl)
			if a.Released {
				c.metrics.releases.Inc()
			}
		case ownership.ActRevoke:
			if lease := l.live[a.Partition]; lease != nil && lease.Token().Same(a.Token) {
				delete(l.live, a.Partition)
				c.leases[a.Partition].CompareAndSwap(lease, nil)
				lease.End(ownership.ErrLeaseEnded)
				now := c.cfg.Clock.Now()
				c.subs.publish(Event{Kind: EventReleased, Node: c.cfg.Name, Partition: a.Partition, Token: a.Token, Time: now})
			}
		}
	}
}

// work runs fn on a worker goroutine, under a context that ends with
// parent or after timeout, and sends its result to the loop.
func (l *loop) work(parent context.Context, timeout time.Duration, fn func(ctx context.Context) result) {
	l.workers.Add(1)
	go func() {
		defer l.workers.Done()
		ctx, cancel := context.WithTimeout(parent, timeout)
		defer cancel()
		l.send(fn(ctx))
	}()
}

func (l *loop) goClaim(p uint32, seen ownership.Token) {
	c := l.c
	l.work(c.ctx, c.cfg.AcquireTimeout, func(ctx context.Context) result {
		tok, err := c.auth.Claim(ctx, p, c.self, seen)
		if err == nil && c.cfg.TokenKeys != nil && tok.MAC == ([ownership.MACSize]byte{}) {
			tok = c.cfg.TokenKeys.Sign(tok)
		}
		return result{kind: resClaimed, partition: p, token: tok, err: err}
	})
}

func (l *loop) goAcquire(lease *ownership.Lease) {
	c := l.c
	l.work(lease.Context(), c.cfg.AcquireTimeout, func(ctx context.Context) result {
		var err error
		if c.cfg.Fence != nil {
			_, err = c.cfg.Fence.Fence(ctx, lease.Token())
		}
		if err == nil {
			err = c.cfg.Handler.Acquire(ctx, lease)
		}
		if err == nil && lease.Err() != nil {
			err = lease.Err()
		}
		return result{kind: resAcquired, token: lease.Token(), err: err}
	})
}

func (l *loop) goRelease(lease *ownership.Lease) {
	c := l.c
	l.work(c.ctx, c.cfg.ReleaseTimeout, func(ctx context.Context) result {
		if err := c.cfg.Handler.Release(ctx, lease); err != nil {
			c.log.Warn("release", "token", lease.Token(), "err", err)
		}
		return result{kind: resReleased, token: lease.Token()}
	})
}

// send hands a result to the loop unless the coordinator is closing.
func (l *loop) send(r result) {
	select {
	case l.c.results <- r:
	case <-l.c.ctx.Done():
	}
}
