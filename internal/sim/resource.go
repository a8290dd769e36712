package sim

import (
	"errors"

	"github.com/tenure-go/tenure/ownership"
)

// errDown is the resource's answer during an outage.
var errDown = errors.New("sim: resource unavailable")

// resource is the protected resource, fenced in Exact mode, and with a
// strict configuration also the authority (like the SQL one: a claim is a
// fence, in the same row).
type resource struct {
	s          *Sim
	marks      []ownership.Token
	outage     bool
	fencedWith map[ownership.Token]bool // every token the resource was fenced with
	// writes applied, and refused as stale or as not fenced
	applied, stale, notFenced int
}

func newResource(s *Sim) *resource {
	return &resource{s: s, marks: make([]ownership.Token, s.cfg.Partitions), fencedWith: make(map[ownership.Token]bool)}
}

func (r *resource) mark(p uint32) ownership.Token { return r.marks[p] }

// raise makes t the mark if it is higher.
func (r *resource) raise(t ownership.Token) {
	if t.Compare(r.marks[t.Partition]) > 0 {
		r.marks[t.Partition] = key(t)
	}
	r.fencedWith[key(t)] = true
	r.s.chk.fenced(t)
}

// fence is ownership.Fence.Fence.
func (r *resource) fence(t ownership.Token) (ownership.Token, error) {
	if r.outage {
		return ownership.Token{}, errDown
	}
	if r.s.keys != nil && r.s.keys.Verify(t) != nil {
		return ownership.Token{}, ownership.ErrBadMAC
	}
	cur := r.marks[t.Partition]
	if t.Compare(cur) < 0 {
		return cur, ownership.Stale(t, cur)
	}
	r.raise(t)
	return r.marks[t.Partition], nil
}

// claim is the strict authority's conditional claim (the SQL one's): p
// moves to the epoch after seen, held by n, unless the mark is past seen;
// then a *ConflictError carries the mark.
func (r *resource) claim(p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	if r.outage {
		return ownership.Token{}, errDown
	}
	cur := r.marks[p]
	if cur.Epoch > seen.Epoch && !r.s.cfg.Bugs.ClaimIgnoresMark {
		return ownership.Token{}, &ownership.ConflictError{Partition: p, Seen: seen, Current: cur}
	}
	t := ownership.Token{Partition: p, Epoch: seen.Epoch + 1, Owner: n.Name, Incarnation: n.Incarnation}
	r.s.chk.strictClaim(t, cur)
	r.raise(t)
	return t, nil
}

// write is a write under t from node n: it reaches the resource after a
// delay, and if n is paused meanwhile it waits for n to resume (a write
// held past a pause, the case fencing exists for). The answer goes back to
// n's ReportStale.
func (r *resource) write(n *node, p uint32, t ownership.Token) {
	s := r.s
	life := n.life
	var deliver func()
	deliver = func() {
		if n.paused && n.life == life {
			n.backlog = append(n.backlog, func() { s.after(s.between(0, 1), deliver) })
			return
		}
		err := r.apply(t)
		switch {
		case errors.Is(err, ownership.ErrStaleToken):
			r.stale++
		case errors.Is(err, ownership.ErrNotFenced):
			r.notFenced++
		}
		if err != nil && !errors.Is(err, errDown) {
			s.after(s.between(0, 1), func() { n.input(life, func() { n.reportStale(err) }) })
		}
	}
	s.after(s.between(0, 2), deliver)
}

// apply judges and applies one write.
func (r *resource) apply(t ownership.Token) error {
	if r.outage {
		return errDown
	}
	if !r.s.cfg.Bugs.NoFenceAtResource {
		if err := ownership.Judge(key(t), r.marks[t.Partition]); err != nil {
			return err
		}
	}
	r.s.chk.applied(t)
	r.applied++
	return nil
}

// reset loses every mark (a fence table reset or restored from a backup).
func (r *resource) reset() {
	for p := range r.marks {
		r.marks[p] = ownership.Token{}
	}
	r.s.chk.reset()
}
