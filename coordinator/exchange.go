package coordinator

import (
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/ownership/gossip"
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

const (
	// exchangeQueue bounds the sends waiting for the exchange goroutine.
	exchangeQueue = 16
	// sectionClaims bounds the claims of one section message (about
	// 12 KB keyed), unless one range holds more (1/32 of the partitions).
	sectionClaims = 512
)

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
