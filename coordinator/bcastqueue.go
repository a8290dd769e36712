package coordinator

import (
	"math"
	"slices"
	"sync"
)

// broadcastQueue holds the claims and stable memberships this node
// gossips, as memberlist's TransmitLimitedQueue did: each is sent in up to
// mult * ceil(log10(members+1)) gossip messages, those sent fewest times
// first and, among them, the newest first; a broadcast queued under a name
// replaces the one queued under it before. It keeps one list per number of
// transmissions instead of a B-tree: at 100 x 4096 in one process,
// memberlist's queue spent 16% of the process's CPU in GetBroadcasts
// (issue 22), most of it deleting and reinserting items in its tree, with
// the collector's write barriers.
//
// Unlike memberlist's queue it doesn't search a whole tier for a message
// small enough for the room left in a packet: it skips at most
// maxSkipped that don't fit before it tries the next tier, so a call costs
// about what it returns. A message skipped is sent in a later packet.
type broadcastQueue struct {
	mult     int
	numNodes func() int

	mu     sync.Mutex
	tiers  [][]*queued        // tiers[t]: sent t times, oldest first
	byName map[string]*queued // the live broadcast of each name
	live   int                // broadcasts in byName
	dead   int                // replaced broadcasts still in tiers
}

// queued is one broadcast in the queue.
type queued struct {
	name      string
	msg       []byte
	transmits int
	dead      bool // replaced: never sent again
}

// maxSkipped is how many messages too big for the room left GetBroadcasts
// passes over in a tier before it moves on.
const maxSkipped = 8

func newBroadcastQueue(mult int, numNodes func() int) *broadcastQueue {
	return &broadcastQueue{mult: mult, numNodes: numNodes, tiers: make([][]*queued, 1), byName: make(map[string]*queued)}
}

// retransmitLimit is how many gossip messages carry each broadcast, with n
// members: memberlist's rule.
func retransmitLimit(mult, n int) int {
	return mult * int(math.Ceil(math.Log10(float64(n+1))))
}

// QueueBroadcast queues msg under name, replacing what was queued under it.
func (q *broadcastQueue) QueueBroadcast(name string, msg []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if old := q.byName[name]; old != nil {
		old.dead = true
		q.live--
		q.dead++
	}
	it := &queued{name: name, msg: msg}
	q.byName[name] = it
	q.tiers[0] = append(q.tiers[0], it)
	q.live++
	if q.dead > 64 && q.dead > q.live {
		q.compact()
	}
}

// compact drops the replaced broadcasts from the tiers.
func (q *broadcastQueue) compact() {
	for t, tier := range q.tiers {
		q.tiers[t] = slices.DeleteFunc(tier, func(it *queued) bool { return it.dead })
	}
	q.dead = 0
}

// NumQueued returns how many broadcasts are left to send.
func (q *broadcastQueue) NumQueued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live
}

// GetBroadcasts returns broadcasts to send in one message of at most limit
// bytes, each taking overhead bytes more than its length, and counts them
// sent.
func (q *broadcastQueue) GetBroadcasts(overhead, limit int) [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.live == 0 {
		return nil
	}
	var out [][]byte
	var sent []*queued
	used := 0
tiers:
	for t := range q.tiers {
		tier, skipped := q.tiers[t], 0
		for i := len(tier) - 1; i >= 0 && skipped < maxSkipped; i-- {
			free := limit - used - overhead
			if free <= 0 {
				q.tiers[t] = tier
				break tiers
			}
			it := tier[i]
			if !it.dead && len(it.msg) > free {
				skipped++
				continue
			}
			tier = slices.Delete(tier, i, i+1) // at the end, but for those skipped
			if it.dead {
				q.dead--
				continue
			}
			out = append(out, it.msg)
			used += overhead + len(it.msg)
			sent = append(sent, it)
		}
		q.tiers[t] = tier
	}
	limitN := retransmitLimit(q.mult, q.numNodes())
	for _, it := range sent {
		it.transmits++
		if it.transmits >= limitN {
			if q.byName[it.name] == it {
				delete(q.byName, it.name)
			}
			q.live--
			continue
		}
		for len(q.tiers) <= it.transmits {
			q.tiers = append(q.tiers, nil)
		}
		q.tiers[it.transmits] = append(q.tiers[it.transmits], it)
	}
	return out
}
