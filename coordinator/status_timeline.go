package coordinator

import (
	"slices"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ring"
)

// A MoveGroup is one change of the partition table as this node saw it,
// with what caused it and which partitions it moved: the status page's
// timeline shows one line per group rather than one per token.
type MoveGroup struct {
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	Causes     []Cause   `json:"causes"`
	Moved      int       `json:"moved"`
	Moves      []Move    `json:"moves"`
	Pending    int       `json:"pending"`
	Superseded bool      `json:"superseded"`
}

// A Cause is a membership change behind a MoveGroup.
type Cause struct {
	// Kind is "joined", "left" (it had handed off every partition),
	// "failed" (it left the table still holding partitions: a crash, a
	// pause or a network cut) or "leaving" (the node began a Leave).
	Kind string `json:"kind"`
	Node string `json:"node"`
	// Held is how many partitions a "failed" node still held.
	Held int `json:"held"`
}

// A Move is the set of partitions one group moved from one ring owner to
// another ("" when there was none: the first table).
type Move struct {
	From       string   `json:"from"`
	To         string   `json:"to"`
	Partitions []uint32 `json:"partitions"`
}

// maxGroups bounds the timeline.
const maxGroups = 16

// timeline groups table changes and their causes. It is fed synchronously
// by the event publisher (on the coordinator's loop), so it never misses a
// change, and read by Status.
type timeline struct {
	mu     sync.Mutex
	last   *ring.Table
	groups []MoveGroup
	seq    uint64 // the last group's Seq

	// changes versions the whole Status for StatusSince; every event
	// marks it dirty.
	changes statusLog
}

// observe records e; t is the table after e, reg the claims heard.
func (tl *timeline) observe(e Event, t *ring.Table, reg *gossip.Register) {
	var cause *Cause
	switch e.Kind {
	case EventMemberJoined:
		cause = &Cause{Kind: "joined", Node: e.Node}
	case EventMemberLeft:
		cause = &Cause{Kind: "left", Node: e.Node}
		if n := reg.HeldBy(e.Node); n > 0 {
			cause.Kind, cause.Held = "failed", n
		}
	case EventLeaving, EventMemberLeaving:
		cause = &Cause{Kind: "leaving", Node: e.Node}
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if t != nil && t != tl.last {
		if n := len(tl.groups); n > 0 && pending(tl.groups[n-1], reg) > 0 {
			tl.groups[n-1].Superseded = true
		}
		tl.seq++
		g := MoveGroup{Seq: tl.seq, Time: e.Time, Causes: []Cause{}, Moves: groupMoves(ring.Diff(tl.last, t))}
		for _, m := range g.Moves {
			g.Moved += len(m.Partitions)
		}
		tl.last = t
		if len(tl.groups) == maxGroups {
			tl.groups = slices.Delete(tl.groups, 0, 1)
		}
		tl.groups = append(tl.groups, g)
	}
	if cause != nil {
		if len(tl.groups) == 0 {
			tl.seq++
			tl.groups = append(tl.groups, MoveGroup{Seq: tl.seq, Time: e.Time, Moves: []Move{}})
		}
		g := &tl.groups[len(tl.groups)-1]
		g.Causes = append(g.Causes, *cause)
	}
}

// groupMoves gathers ring moves by (from, to), in order of first partition.
func groupMoves(moves []ring.Move) []Move {
	out := []Move{}
	index := map[[2]string]int{}
	for _, mv := range moves {
		k := [2]string{mv.From, mv.To}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, Move{From: mv.From, To: mv.To})
		}
		out[i].Partitions = append(out[i].Partitions, mv.Partition)
	}
	return out
}

// snapshot copies the groups, with the newest group's Pending counted
// from reg.
func (tl *timeline) snapshot(reg *gossip.Register) []MoveGroup {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := make([]MoveGroup, len(tl.groups))
	for i, g := range tl.groups {
		g.Causes = slices.Clone(g.Causes)
		g.Moves = slices.Clone(g.Moves)
		out[i] = g
	}
	if n := len(out); n > 0 {
		out[n-1].Pending = pending(out[n-1], reg)
	}
	return out
}

// pending counts the partitions of g not yet held by their new owner.
func pending(g MoveGroup, reg *gossip.Register) int {
	n := 0
	for _, m := range g.Moves {
		for _, p := range m.Partitions {
			if cl := reg.GetClaim(p); m.To != "" && (cl.Released || cl.Token.Owner != m.To) {
				n++
			}
		}
	}
	return n
}

// observeEvent feeds the timeline; the event publisher calls it for every
// event, before subscribers see it.
func (c *Coordinator) observeEvent(e Event) {
	c.timeline.observe(e, c.Table(), c.reg)
	c.timeline.changes.dirty.Store(true)
}
