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
