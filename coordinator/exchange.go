package coordinator

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// The digest exchange (issue 22). A periodic push/pull carries the stable
// membership and the digest of the register (gossip.KindDigest), a few
// hundred bytes however many partitions there are; a join's push/pull
// still carries the whole register (gossip.KindState), which the joiner
// needs. A node whose digest differs from a peer's, and whose name sorts
// first (so one of the two asks, not both), sends the peer the claims it
// holds in the ranges that differ, as sections that ask for an answer; the
// peer merges them like any gossip and answers with the claims it holds
// above them. After both merges the two agree on those ranges.
//
// Sections travel by memberlist's SendReliable: a TCP stream to the peer's
// gossip port that arrives at its delegate's NotifyMsg, encrypted and
// labelled as the rest of gossip, with no packet-size limit (a section is
// up to sectionClaims claims), and opened as the broadcast channel's
// messages are (MACs checked, the claims' too). memberlist must not be
// called from its delegate's callbacks: they hand the sends to one
// goroutine through a queue of exchangeQueue jobs, and what does not fit
// is dropped and counted (traffic.exchangeDropped); the next push/pull
// finds the difference again.
//
// An asking section is answered only when it is due (issue 22 review): an
// ask is some 30 bytes, may come by UDP (memberlist hands packets and
// streams to NotifyMsg alike, so the delegate can't tell them apart), and
// can be a replay of an authentic one, while its answer is up to the whole
// register by TCP, and a trickle of replays would keep the queue full. So
// the asked side (the one whose name sorts second) answers member P's ask
// only for ranges in which P's digest, merged in a push/pull at most
// askWindow ago, differed from its own, each range once: an answer clears
// it. A digest opens ranges at most once per askWindow/2 per member, so
// replayed digests can't open them faster, and at most one register's
// worth of answers goes to each member per askWindow/2. An ask naming
// ranges that are open and ranges that are not is answered for the open
// ones. What is not due is parked, one ask per member (later asks merge
// into it, by range: at most one register's claims), and answered for
// the ranges the next digest opens within askWindow. askWindow is the
// push/pull interval clamped to 1-30 s. Times are the Config's Clock; a
// clock that steps back reopens at once rather than waiting out the step.
// The state is per current member (nodeSet) and goes when the member
// leaves; asks from anyone else are refused.
//
// Stable asks (gossip.KindAskStable) go the same way, by SendReliable, on
// goroutines of their own: a node that sees a member show a newer stable
// membership than its own asks it for it (loop.sync), and the member
// answers with its stable membership (gossip.KindStable) if it is newer
// than the asker's, once per stable membership and at most once per
// askWindow/2 per member (stableDue). Each carries a stable membership,
// some 10 bytes a member, where a push/pull carried the whole register
// both ways; after syncByStateAfter asks for the same one, a node
// exchanges whole states again (a member of an older version doesn't
// answer asks, and one whose answer names members this node doesn't know
// leaves it in doubt, which memberlist's push/pull resolves).

const (
	// exchangeQueue bounds the sends waiting for the exchange goroutine.
	exchangeQueue = 16
	// sectionClaims bounds the claims of one section message (about
	// 12 KB keyed), unless one range holds more (1/32 of the partitions).
	sectionClaims = 512
)

// askWindow returns how long after a differing digest from a member its
// asks are answered: the push/pull interval, within 1 to 30 s.
func askWindow(ml *memberlist.Config) time.Duration {
	w := time.Second
	if ml != nil {
		w = ml.PushPullInterval
	}
	return min(max(w, time.Second), 30*time.Second)
}

// asks is the asked side's record of which of a member's asks are due.
type asks struct {
	opened  time.Time       // when a digest of the member's last opened ranges
	ranges  uint64          // bit i: range i differed then and is not answered yet
	parked  *gossip.Section // an ask that came before its digest, and when
	parkedT time.Time
	// stableSent and stableID: when this node last answered the member's
	// ask for its stable membership, and with which (stableDue).
	stableSent time.Time
	stableID   quorum.StableID
}

// rangeBits returns ranges as bits (ranges of a digest are below
// gossip.DigestRanges, so below 64).
func rangeBits(ranges []int) uint64 {
	var b uint64
	for _, r := range ranges {
		b |= 1 << (uint(r) % 64)
	}
	return b
}

// memberAsks returns member name's record of asks, made on first use, or
// nil if name is not a member. s.mu must be held.
func (s *nodeSet) memberAsks(name string) *asks {
	if _, ok := s.nodes[name]; !ok {
		return nil
	}
	if s.asks == nil {
		s.asks = make(map[string]*asks)
	}
	a := s.asks[name]
	if a == nil {
		a = &asks{}
		s.asks[name] = a
	}
	return a
}

// openAsks records that member name's digest differed from this node's
// in ranges at now: its asks for them are due for window. It returns a
// parked ask of name's that is now due, or nil. A non-member, or a member
// whose ranges were opened less than window/2 ago, opens nothing.
func (s *nodeSet) openAsks(name string, ranges []int, now time.Time, window time.Duration) *gossip.Section {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.memberAsks(name)
	if a == nil {
		return nil
	}
	// A clock that stepped back (now before the last opening) reopens: the
	// guard bounds a rate, and must not stop answering for as long as the
	// step.
	if !a.opened.IsZero() && !now.Before(a.opened) && now.Sub(a.opened) < window/2 {
		return nil
	}
	a.opened, a.ranges = now, rangeBits(ranges)
	p := a.parked
	a.parked = nil
	if p == nil || now.Sub(a.parkedT) > window {
		return nil
	}
	due, rest := a.take(*p)
	if rest != nil {
		a.parked = rest // parkedT stays: it expires with the ask it came from
	}
	return due
}

// stableDue reports whether an answer with stable membership id is due
// to member name's ask: name is a member, and this node has not answered
// it with id, or did no sooner than window/2 ago. An ask can be replayed,
// so answers to each member are bounded: one per stable membership, and
// one per window/2. With mark, the answer is recorded as sent; unmark
// undoes that after a send that failed.
func (s *nodeSet) stableDue(name string, id quorum.StableID, now time.Time, window time.Duration, mark bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.memberAsks(name)
	if a == nil {
		return false
	}
	// A clock that stepped back answers at once, as openAsks reopens.
	if a.stableID == id && !a.stableSent.IsZero() && !now.Before(a.stableSent) && now.Sub(a.stableSent) < window/2 {
		return false
	}
	if mark {
		a.stableSent, a.stableID = now, id
	}
	return true
}

// unmarkStable forgets an answer to member name recorded at sent.
func (s *nodeSet) unmarkStable(name string, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.asks[name]; a != nil && a.stableSent.Equal(sent) {
		a.stableSent, a.stableID = time.Time{}, quorum.StableID{}
	}
}

// offerStableAnswer queues an answer to member name's stable ask, or
// drops and counts it when the queue is full. It never blocks: the
// delegate calls it.
func (c *Coordinator) offerStableAnswer(name string) {
	select {
	case c.stableCh <- name:
	default:
		c.traffic.stableRefused.Add(1)
	}
}

// runStableAnswers sends the answers to stable asks, one at a time, on a
// goroutine of their own: a digest exchange's sends to a slow member must
// not hold back what lets a node back to a quorum. An answer is recorded
// as sent (stableDue) only once it is: one dropped or failed doesn't
// stop the next ask's.
func (c *Coordinator) runStableAnswers() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case name := <-c.stableCh:
			c.answerStable(name)
		}
	}
}

func (c *Coordinator) answerStable(name string) {
	own := *c.stable.Load()
	now := c.cfg.Clock.Now()
	if !c.nodes.stableDue(name, own.ID(), now, c.askWindow, true) {
		c.traffic.stableRefused.Add(1)
		return
	}
	if err := c.sendStable(name, gossip.KindStable, own); err != nil {
		c.nodes.unmarkStable(name, now)
		c.log.Debug("answer a stable ask", "peer", name, "err", err)
		return
	}
	c.traffic.stableAnswers.Add(1)
}

// sendStable sends member name stable as a message of kind (an ask or an
// answer) by memberlist's SendReliable.
func (c *Coordinator) sendStable(name string, kind gossip.Kind, stable quorum.Stable) error {
	to, ok := c.nodes.node(name)
	if !ok {
		return fmt.Errorf("%s is not a member", name)
	}
	msg, err := gossip.Message{Kind: kind, Cluster: c.cfg.ClusterName, Sender: c.cfg.Name, Stable: stable}.Seal(c.cfg.TokenKeys)
	if err != nil {
		return err
	}
	return c.ml.SendReliable(to, msg)
}

// askDue returns the part of member name's ask sec that is due (in ranges
// open now), marking those ranges answered, or nil if none is. The rest is
// parked, merged into the ask parked before, for a digest to open its
// ranges. Asks of non-members are never due and never parked.
func (s *nodeSet) askDue(name string, sec *gossip.Section, now time.Time, window time.Duration) *gossip.Section {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.memberAsks(name)
	if a == nil {
		return nil
	}
	rest := sec
	var due *gossip.Section
	if !a.opened.IsZero() && (now.Before(a.opened) || now.Sub(a.opened) <= window) {
		due, rest = a.take(*sec)
	}
	if rest != nil {
		if a.parked != nil && now.Sub(a.parkedT) <= window {
			merged := mergeAsks(*a.parked, *rest)
			rest = &merged
		}
		a.parked, a.parkedT = rest, now
	}
	return due
}

// take splits ask s by a's open ranges: due, the part of s in ranges that
// are open (now cleared), nil if none; rest, the part in ranges that are
// not, nil if none.
func (a *asks) take(s gossip.Section) (due, rest *gossip.Section) {
	open := rangeBits(s.Ranges) & a.ranges
	a.ranges &^= open
	in, out := sectionPart(s, open, true), sectionPart(s, open, false)
	if len(in.Ranges) > 0 {
		due = &in
	}
	if len(out.Ranges) > 0 {
		rest = &out
	}
	return due, rest
}

// sectionPart returns the part of s in the ranges of bits (inside) or in
// its other ranges (!inside): those ranges and their claims.
func sectionPart(s gossip.Section, bits uint64, inside bool) gossip.Section {
	part := gossip.Section{Partitions: s.Partitions, Ask: s.Ask}
	for _, r := range s.Ranges {
		if (bits&(1<<(uint(r)%64)) != 0) != inside {
			continue
		}
		part.Ranges = append(part.Ranges, r)
		lo, hi := gossip.RangeBounds(s.Partitions, r)
		for _, c := range s.Claims {
			if p := c.Token.Partition; p >= lo && p < hi {
				part.Claims = append(part.Claims, c)
			}
		}
	}
	return part
}

// mergeAsks returns one ask of old's and new's ranges, new's claims for
// a range both name: bounded by one register whatever the number merged.
func mergeAsks(old, new gossip.Section) gossip.Section {
	newBits := rangeBits(new.Ranges)
	kept := sectionPart(old, newBits, false) // old's ranges that new does not name
	bits := rangeBits(kept.Ranges) | newBits
	m := gossip.Section{Partitions: new.Partitions, Ask: true}
	for r := range gossip.Ranges(new.Partitions) {
		if bits&(1<<(uint(r)%64)) == 0 {
			continue
		}
		m.Ranges = append(m.Ranges, r)
		from := kept
		if newBits&(1<<(uint(r)%64)) != 0 {
			from = new
		}
		lo, hi := gossip.RangeBounds(new.Partitions, r)
		for _, c := range from.Claims {
			if p := c.Token.Partition; p >= lo && p < hi {
				m.Claims = append(m.Claims, c)
			}
		}
	}
	return m
}

// A logLimit lets a log line through at most once per interval, and
// counts those it held back meanwhile.
type logLimit struct {
	mu   sync.Mutex
	next time.Time
	held int
}

// allow reports whether to log at now, and how many were held back since
// the last line let through.
func (l *logLimit) allow(now time.Time, every time.Duration) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.held++
		return false, 0
	}
	held := l.held
	l.next, l.held = now.Add(every), 0
	return true, held
}

// exchangeJob is a send for the exchange goroutine: sections of ranges,
// asking peer for an answer, or the answer to peer's asking section.
type exchangeJob struct {
	peer   string
	ranges []int
	answer *gossip.Section
}

// offerExchange queues j for the exchange goroutine, or drops and counts
// it when the queue is full. It never blocks: the delegate calls it.
func (c *Coordinator) offerExchange(j exchangeJob) {
	select {
	case c.exch <- j:
	default:
		c.traffic.exchangeDropped.Add(1)
		c.log.Debug("digest exchange queue full: dropped", "peer", j.peer)
	}
}

// runExchange sends the queued sections until c closes.
func (c *Coordinator) runExchange() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case j := <-c.exch:
			c.exchange(j)
		}
	}
}

func (c *Coordinator) exchange(j exchangeJob) {
	to, ok := c.nodes.node(j.peer)
	if !ok {
		c.traffic.exchangeDropped.Add(1)
		return
	}
	var sections []gossip.Section
	if j.answer != nil {
		sections = c.reg.Answer(*j.answer, sectionClaims)
	} else {
		sections = c.reg.Sections(j.ranges, sectionClaims)
	}
	for _, s := range sections {
		msg, err := gossip.Message{Kind: gossip.KindSection, Cluster: c.cfg.ClusterName, Sender: c.cfg.Name, Section: s}.Seal(c.cfg.TokenKeys)
		if err != nil {
			c.log.Error("encode section", "err", err)
			return
		}
		if err := c.ml.SendReliable(to, msg); err != nil {
			c.log.Debug("send section", "peer", j.peer, "err", err)
			return
		}
		c.traffic.sections.Add(1)
		c.traffic.sectionBytes.Add(uint64(len(msg)))
	}
}

// node returns a memberlist node to send to member name, built from its
// gossip address (memberlist's own nodes may not be read outside its
// callbacks).
func (s *nodeSet) node(name string) (*memberlist.Node, bool) {
	s.mu.Lock()
	e, ok := s.nodes[name]
	s.mu.Unlock()
	if !ok || e.err != nil { // metadata that failed its checks: in no view, sent nothing
		return nil, false
	}
	host, port, err := net.SplitHostPort(e.member.GossipAddr)
	if err != nil {
		return nil, false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return nil, false
	}
	return &memberlist.Node{Name: name, Addr: ip, Port: uint16(p)}, true
}
