package coordinator

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/memberlist"
)

// drain calls GetBroadcasts until the queue is empty, at most rounds
// times, and counts each message sent, checking that every call fits in
// limit and sends no message twice.
func drain(t *testing.T, q *broadcastQueue, overhead, limit, rounds int) map[string]int {
	t.Helper()
	sent := map[string]int{}
	for r := 0; r < rounds && q.NumQueued() > 0; r++ {
		out := q.GetBroadcasts(overhead, limit)
		used, seen := 0, map[string]bool{}
		for _, m := range out {
			used += overhead + len(m)
			if seen[string(m)] {
				t.Fatalf("round %d sent %q twice", r, m)
			}
			seen[string(m)] = true
			sent[string(m)]++
		}
		if used > limit {
			t.Fatalf("round %d sent %d bytes, limit %d", r, used, limit)
		}
	}
	if n := q.NumQueued(); n != 0 {
		t.Fatalf("%d broadcasts left after %d rounds", n, rounds)
	}
	return sent
}

func msgOf(name string, size int) []byte {
	b := []byte(name + ":")
	for len(b) < size {
		b = append(b, '.')
	}
	return b
}

// Every broadcast is sent retransmitLimit times (mult * ceil(log10(n+1))),
// then dropped; no call exceeds its limit or sends a message twice.
func TestBroadcastQueueSendsEachTheLimit(t *testing.T) {
	for _, n := range []int{1, 9, 10, 100} {
		q := newBroadcastQueue(3, func() int { return n })
		want := retransmitLimit(3, n)
		for i := range 200 {
			q.QueueBroadcast(fmt.Sprint(i), msgOf(fmt.Sprint(i), 90+i%20))
		}
		sent := drain(t, q, 2, 1400, 10000)
		if len(sent) != 200 {
			t.Fatalf("n=%d: %d of 200 broadcasts sent", n, len(sent))
		}
		for m, k := range sent {
			if k != want {
				t.Fatalf("n=%d: %q sent %d times, want %d", n, m, k, want)
			}
		}
	}
	if got := retransmitLimit(3, 100); got != 9 {
		t.Fatalf("retransmitLimit(3, 100) = %d, want 9 (memberlist's rule)", got)
	}
}

// A broadcast queued under a name replaces the one before, sent or not:
// the old one is never sent again, and the new one is sent in full.
func TestBroadcastQueueReplacesByName(t *testing.T) {
	q := newBroadcastQueue(2, func() int { return 9 }) // 2 transmissions
	q.QueueBroadcast("p1", []byte("old"))
	q.QueueBroadcast("p2", []byte("other"))
	if out := q.GetBroadcasts(0, 1000); len(out) != 2 {
		t.Fatalf("first round sent %q, want both", out)
	}
	q.QueueBroadcast("p1", []byte("new"))
	if n := q.NumQueued(); n != 2 {
		t.Fatalf("%d queued after a replacement, want 2", n)
	}
	sent := drain(t, q, 0, 1000, 10)
	if sent["old"] != 0 || sent["new"] != 2 || sent["other"] != 1 {
		t.Fatalf("after the replacement: sent %v, want new twice, other once more, old never", sent)
	}
	// Many replacements: the replaced are dropped (compacted), the live
	// all sent.
	for round := range 5 {
		for i := range 100 {
			q.QueueBroadcast(fmt.Sprint(i), []byte(fmt.Sprint(round, "/", i)))
		}
	}
	sent = drain(t, q, 0, 1000, 1000)
	for m := range sent {
		if m[0] != '4' {
			t.Fatalf("replaced broadcast %q sent", m)
		}
	}
	if len(sent) != 100 {
		t.Fatalf("%d of the 100 live broadcasts sent", len(sent))
	}
	if q.dead != 0 {
		t.Fatalf("%d replaced broadcasts left in the tiers of an empty queue", q.dead)
	}
}

// Those sent fewest times go first, and among them the newest; a message
// too big for the room left is passed over for one that fits.
func TestBroadcastQueueOrder(t *testing.T) {
	q := newBroadcastQueue(3, func() int { return 9 }) // 3 transmissions
	q.QueueBroadcast("a", []byte("aaaa"))
	q.GetBroadcasts(0, 4) // a sent once
	q.QueueBroadcast("b", []byte("bbbb"))
	q.QueueBroadcast("c", []byte("cccc"))
	if out := q.GetBroadcasts(0, 4); len(out) != 1 || string(out[0]) != "cccc" {
		t.Fatalf("room for one: sent %q, want the newest unsent (cccc)", out)
	}
	if out := q.GetBroadcasts(0, 8); len(out) != 2 || string(out[0]) != "bbbb" || string(out[1]) != "cccc" {
		t.Fatalf("room for two: sent %q, want bbbb (never sent) then cccc (once, newer than aaaa)", out)
	}
	q.QueueBroadcast("big", make([]byte, 100))
	q.QueueBroadcast("small", []byte("s"))
	q.QueueBroadcast("big2", make([]byte, 100))
	if out := q.GetBroadcasts(0, 10); len(out) != 3 || string(out[0]) != "s" || string(out[1]) != "bbbb" || string(out[2]) != "aaaa" {
		t.Fatalf("room for 10 bytes: sent %q, want s (past the two big ones) and then bbbb and aaaa, sent once each", out)
	}
}

// The same broadcasts, without replacements, drained from this queue and
// from memberlist's: each is sent as many times by both.
func TestBroadcastQueueSendsAsMemberlistDoes(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		n := 1 + rnd.IntN(200)
		ours := newBroadcastQueue(3, func() int { return n })
		theirs := &memberlist.TransmitLimitedQueue{NumNodes: func() int { return n }, RetransmitMult: 3}
		var names []string
		for i := range 1 + rnd.IntN(300) {
			name := fmt.Sprint(i)
			msg := msgOf(name, 20+rnd.IntN(200))
			names = append(names, string(msg))
			ours.QueueBroadcast(name, msg)
			theirs.QueueBroadcast(testBroadcast(msg))
		}
		got := drain(t, ours, 2, 1400, 100000)
		want := map[string]int{}
		for r := 0; r < 100000 && theirs.NumQueued() > 0; r++ {
			for _, m := range theirs.GetBroadcasts(2, 1400) {
				want[string(m)]++
			}
		}
		for _, m := range names {
			if got[m] != want[m] {
				t.Fatalf("trial %d (n=%d): %.10q sent %d times, memberlist's queue %d", trial, n, m, got[m], want[m])
			}
		}
	}
}

type testBroadcast []byte

func (b testBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b testBroadcast) Message() []byte                       { return b }
func (b testBroadcast) Finished()                             {}

// BenchmarkBroadcastQueue: a queue of 4096 claims' worth, one gossip
// message taken and as many claims queued per op, as at a join of a big
// cluster. Compare ours with memberlist's in the same run:
//
//	go test ./coordinator -run '^$' -bench BroadcastQueue -benchmem
func BenchmarkBroadcastQueue(b *testing.B) {
	const size = 4096
	msgs := make([][]byte, size)
	for i := range msgs {
		msgs[i] = msgOf(fmt.Sprint(i), 90)
	}
	nodes := func() int { return 100 }
	run := func(b *testing.B, queue func(name string, msg []byte), get func() [][]byte) {
		for i := range size {
			queue(fmt.Sprint(i), msgs[i])
		}
		names := make([]string, size)
		for i := range names {
			names[i] = fmt.Sprint(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		next := 0
		for range b.N {
			for range get() {
				queue(names[next%size], msgs[next%size])
				next++
			}
		}
	}
	b.Run("ours", func(b *testing.B) {
		q := newBroadcastQueue(6, nodes)
		run(b, q.QueueBroadcast, func() [][]byte { return q.GetBroadcasts(2, 1400) })
	})
	b.Run("memberlist", func(b *testing.B) {
		q := &memberlist.TransmitLimitedQueue{NumNodes: nodes, RetransmitMult: 6}
		run(b, func(name string, msg []byte) { q.QueueBroadcast(&namedTestBroadcast{name, msg}) }, func() [][]byte { return q.GetBroadcasts(2, 1400) })
	})
}

type namedTestBroadcast struct {
	name string
	msg  []byte
}

func (b *namedTestBroadcast) Invalidates(o memberlist.Broadcast) bool {
	n, ok := o.(memberlist.NamedBroadcast)
	return ok && n.Name() == b.name
}
func (b *namedTestBroadcast) Name() string    { return b.name }
func (b *namedTestBroadcast) Message() []byte { return b.msg }
func (b *namedTestBroadcast) Finished()       {}
