package coordinator

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	EventMemberJoined EventKind = iota + 1 // Node entered the table
	EventMemberLeft                        // Node left the table (left or failed)
	EventAcquired                          // this node now owns Partition under Token
	EventLeaseEnded                        // this node's lease on Partition ended, for any Cause
	EventLeaving                           // this node started a graceful Leave
	// EventHolderChanged: this node learned a new holder of Partition
	// (Node, under Token), from gossip or its own claim; Node is "" when
	// the holder released it. With EventMemberLeft it tells a router that
	// calls in flight to the old holder should move. Gossip carries each
	// partition's newest claim: one superseded before it reached this node
	// is not reported (a release its node followed at once with a new
	// claim may arrive only as that claim).
	EventHolderChanged
	// EventMemberLeaving: member Node announced a graceful Leave: it is
	// out of the table and hands its partitions off (EventMemberLeft
	// follows when it is gone).
	EventMemberLeaving
)

// EventReleased is EventLeaseEnded's old name. It reports any end of a
// lease, not only a release (a planned handoff), which is why it was
// renamed; its String, once "released", is now "lease-ended".
//
// Deprecated: use EventLeaseEnded.
const EventReleased = EventLeaseEnded

var eventNames = [...]string{"", "member-joined", "member-left", "acquired", "lease-ended", "leaving", "holder-changed", "member-leaving"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "event(?)"
}

// An Event is a change of membership or of this node's ownership.
type Event struct {
	Kind      EventKind
	Node      string
	Partition uint32
	Token     ownership.Token
	Time      time.Time
	// Cause, for EventLeaseEnded: why the lease ended (it wraps
	// ownership.ErrLeaseEnded; ownership.ErrLeaseReleased for a handoff).
	Cause error
}

// Subscribe returns a channel of events with room for buf of them, and a
// function that ends the subscription and closes the channel. Events are
// sent from the coordinator's loop and never block it (nor memberlist): when
// the channel is full, events are dropped and counted in Dropped. A
// subscriber that must not miss a change re-reads Table or Owner after a
// drop.
func (c *Coordinator) Subscribe(buf int) (<-chan Event, func()) {
	return c.subs.add(buf)
}

// Dropped returns how many events were dropped for slow subscribers.
func (c *Coordinator) Dropped() uint64 { return c.subs.dropped.Load() }

type subscribers struct {
	tap     func(Event) // sees every event first (the status timeline); set by New
	mu      sync.Mutex
	chans   map[chan Event]struct{}
	closed  bool
	dropped atomic.Uint64
}

func (s *subscribers) add(buf int) (<-chan Event, func()) {
	ch := make(chan Event, max(buf, 0))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		close(ch)
		return ch, func() {}
	}
	if s.chans == nil {
		s.chans = make(map[chan Event]struct{})
	}
	s.chans[ch] = struct{}{}
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.chans[ch]; ok {
			delete(s.chans, ch)
			close(ch)
		}
	}
}

func (s *subscribers) publish(e Event) {
	if s.tap != nil {
		s.tap(e)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.chans {
		select {
		case ch <- e:
		default:
			s.dropped.Add(1)
		}
	}
}

func (s *subscribers) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for ch := range s.chans {
		close(ch)
	}
	s.chans = nil
}
