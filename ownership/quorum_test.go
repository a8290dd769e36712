package ownership

import (
	"fmt"
	"slices"
	"testing"
)

// Issue 19, defect 7: the members asked for a newer stable membership were
// remembered forever, one entry per member ever asked, so a long-lived node
// in a cluster with churn grew the map without bound. An entry is dropped
// when its member leaves the view, or when the node's own stable
// membership reaches the ID it was asked for; a member still in the view
// that still shows the same newer ID is not asked twice.
func TestQuorumForgetsWhomItAsked(t *testing.T) {
	q := &quorum{self: "a", stableAfter: 5, stable: NewStable(3, []string{"a", "b", "c"})}
	newer := NewStable(4, []string{"a", "b", "c"}).ID()
	var view []ViewMember
	view = append(view, ViewMember{Name: "a", Stable: q.stable.ID()})
	for i := range 100 {
		view = append(view, ViewMember{Name: fmt.Sprintf("n%03d", i), Stable: newer})
	}
	q.setView(1, view, nil)
	if got := q.toAsk(); len(got) != 100 {
		t.Fatalf("asked %d members for the newer set, want 100", len(got))
	}
	q.setView(2, view, nil)
	if got := q.toAsk(); len(got) != 0 {
		t.Fatalf("asked %v again for the same set", got)
	}

	// Half the members go away: they are forgotten.
	q.setView(3, view[:51], nil)
	if got := q.toAsk(); len(got) != 0 {
		t.Fatalf("asked %v again after the view shrank", got)
	}
	if len(q.asked) != 50 {
		t.Fatalf("%d members remembered as asked, want the 50 still in view", len(q.asked))
	}
	for name := range q.asked {
		if !slices.ContainsFunc(view[1:51], func(m ViewMember) bool { return m.Name == name }) {
			t.Fatalf("%s, gone from the view, is still remembered", name)
		}
	}

	// The node learns the newer set: nothing is left to ask for.
	q.stable = NewStable(4, []string{"a", "b", "c"})
	q.setView(4, view[:51], nil)
	q.toAsk()
	if len(q.asked) != 0 {
		t.Fatalf("%d members remembered after the node reached the set they were asked for", len(q.asked))
	}
	// A member that later shows a still newer set is asked again.
	view[1].Stable = NewStable(5, []string{"a", "b"}).ID()
	q.setView(5, view[:51], nil)
	if got := q.toAsk(); !slices.Equal(got, []string{view[1].Name}) {
		t.Fatalf("asked %v, want %s for its newer set", got, view[1].Name)
	}
}

// Review of issue 19: the leave rule made the view before the leave the
// new stable membership, newcomers not yet promoted included. Stable
// {a,b,c}, newcomers d..g in every view (they show {a,b,c}, so they wait
// for promotion), and a split {a,b} | {c..g} as c leaves: a and b, who
// miss the goodbye, keep 2 of {a,b,c}; d, who hears it, made {a,b,d..g}
// its stable membership and counted 4 of its 6: two quorums. A leave
// shrinks the stable membership; it must not grow it by members no
// quorum promoted.
func TestQuorumLeaveDoesNotPromoteNewcomers(t *testing.T) {
	stable := NewStable(1, []string{"a", "b", "c"})
	member := func(names ...string) []ViewMember {
		var v []ViewMember
		for _, n := range names {
			v = append(v, ViewMember{Name: n, Stable: stable.ID()})
		}
		return v
	}
	all := []string{"a", "b", "c", "d", "e", "f", "g"}

	far := &quorum{self: "a", stableAfter: 100, stable: stable}
	far.setView(1, member(all...), nil)
	far.setView(2, member("a", "b"), nil) // c and d..g lost to the split, no goodbye heard
	if !far.ok {
		t.Fatalf("a, with 2 of %v, counts no quorum", far.stable.Members)
	}

	near := &quorum{self: "d", stableAfter: 100, stable: stable}
	near.setView(1, member(all...), nil)
	if near.stable.ID() != stable.ID() {
		t.Fatalf("d promoted %v within StableAfter", near.stable.Members)
	}
	near.setView(2, member("a", "b", "d", "e", "f", "g"), []string{"c"}) // c's goodbye heard
	near.setView(3, member("d", "e", "f", "g"), nil)                     // a, b lost to the split
	if near.ok {
		t.Fatalf("both sides of the split count a quorum: a of %v, d of %v", far.stable.Members, near.stable.Members)
	}
	for _, m := range near.stable.Members {
		if !stable.Has(m) {
			t.Fatalf("the leave made %v the stable membership, with %s no quorum promoted", near.stable.Members, m)
		}
	}
}
