package machine

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// Issue 19, defect 7: the members asked for a newer stable membership were
// remembered forever, one entry per member ever asked, so a long-lived node
// in a cluster with churn grew the map without bound. Since issue 22 the
// node remembers one ask per newer stable ID its view shows (not one per
// member: see TestQuorumAsksOneMemberPerNewerMembership), and an entry is
// dropped when no member of the view shows its ID any more, or when the
// node's own stable membership reaches it.
func TestQuorumForgetsWhomItAsked(t *testing.T) {
	q := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	newer := quorum.NewStable(4, []string{"a", "b", "c"}).ID()
	var view []ViewMember
	view = append(view, ViewMember{Name: "a", Stable: q.stable.ID()})
	for i := range 100 {
		view = append(view, ViewMember{Name: fmt.Sprintf("n%03d", i), Stable: newer})
	}
	q.setView(1, view, nil)
	if got := q.toAsk(1); len(got) != 1 {
		t.Fatalf("asked %d members for the newer set, want 1", len(got))
	}
	q.setView(2, view, nil)
	if got := q.toAsk(2); len(got) != 0 {
		t.Fatalf("asked %v again for the same set within the retry wait", got)
	}

	// Half the members go away, the one asked among them or not: still
	// one entry, for the one ID shown.
	q.setView(3, view[:51], nil)
	q.toAsk(3)
	if len(q.asked) != 1 {
		t.Fatalf("%d stable IDs remembered as asked, want the 1 the view shows", len(q.asked))
	}
	for _, a := range q.asked {
		if !slices.ContainsFunc(view[1:51], func(m ViewMember) bool { return m.Name == a.node }) {
			t.Fatalf("%s, gone from the view, is still remembered as asked", a.node)
		}
	}

	// The node learns the newer set: nothing is left to ask for.
	q.stable = quorum.NewStable(4, []string{"a", "b", "c"})
	q.setView(4, view[:51], nil)
	q.toAsk(4)
	if len(q.asked) != 0 {
		t.Fatalf("%d entries remembered after the node reached the set they were asked for", len(q.asked))
	}
	// A member in step that later shows a set two versions newer is asked
	// a retry wait later (TestQuorumWaitsForAStepItCanHear).
	view[1].Stable = quorum.NewStable(6, []string{"a", "b"}).ID()
	var got []string
	now := uint64(5)
	for ; now <= 5+q.retry && len(got) == 0; now++ {
		q.setView(now, view[:51], nil)
		got = q.toAsk(now)
	}
	if !slices.Equal(got, []string{view[1].Name}) || now-1 != 5+q.retry {
		t.Fatalf("asked %v at tick %d, want %s for its newer set at tick %d", got, now-1, view[1].Name, 5+q.retry)
	}
	// It stops showing it (it went back or the entry was forged): forgotten.
	view[1].Stable = q.stable.ID()
	q.setView(now, view[:51], nil)
	q.toAsk(now)
	if len(q.asked) != 0 {
		t.Fatalf("%v remembered after no member shows its ID", q.asked)
	}
}

// Issue 22: an outdated node asked every member that showed a newer stable
// membership for a full state exchange, at once: about n^2/10 exchanges of
// the whole register per membership change in a cluster of n (21 per join
// at 10 nodes, 85-141 per start at 25). One member is asked per newer
// stable ID; another only after a retry wait without reaching it (RetryTicks,
// doubling, at most MaxRetryTicks), or at once if the member asked is gone
// from the view. Two different newer IDs are asked for separately.
func TestQuorumAsksOneMemberPerNewerMembership(t *testing.T) {
	q := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	v4 := quorum.NewStable(4, []string{"a", "b", "c"}).ID()
	view := []ViewMember{{Name: "a", Stable: q.stable.ID()}}
	for i := range 20 {
		view = append(view, ViewMember{Name: fmt.Sprintf("n%02d", i), Stable: v4})
	}
	q.setView(1, view, nil)
	asked := map[string]bool{}
	var at []uint64
	for now := uint64(1); now <= 60; now++ {
		got := q.toAsk(now)
		if len(got) > 1 {
			t.Fatalf("tick %d: asked %v at once for one newer set, want one", now, got)
		}
		for _, n := range got {
			if asked[n] {
				t.Fatalf("tick %d: asked %s twice while others were left to ask", now, n)
			}
			asked[n] = true
			at = append(at, now)
		}
	}
	// Waits of 4, 8, 16, then 16 (the most).
	if want := []uint64{1, 5, 13, 29, 45}; !slices.Equal(at, want) {
		t.Fatalf("asked at ticks %v, want %v", at, want)
	}

	// The member asked last leaves the view: another is asked at once.
	var last string
	for _, a := range q.asked {
		last = a.node
	}
	view = slices.DeleteFunc(view, func(m ViewMember) bool { return m.Name == last })
	q.setView(61, view, nil)
	if got := q.toAsk(61); len(got) != 1 || got[0] == last {
		t.Fatalf("asked %v after %s, the member asked, left; want one other", got, last)
	}

	// A second, newer ID shown by some (not the member asked for the
	// first): one ask for it too, none more.
	v5 := quorum.NewStable(5, []string{"a", "b"}).ID()
	for i, shown := 1, 0; shown < 5; i++ {
		if view[i].Name != q.asked[v4].node {
			view[i].Stable = v5
			shown++
		}
	}
	q.setView(62, view, nil)
	got := q.toAsk(62)
	if len(got) != 1 || q.ids[got[0]] != v5 {
		t.Fatalf("asked %v for a second newer set, want one member that shows it", got)
	}

	// Nodes that fall behind together don't all ask the same member.
	first := map[string]bool{}
	for i := range 20 {
		r := &tracker{self: fmt.Sprintf("x%02d", i), stableAfter: 5, retry: 4, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
		v := append([]ViewMember{{Name: r.self, Stable: r.stable.ID()}}, view[6:]...)
		r.setView(1, v, nil)
		for _, n := range r.toAsk(1) {
			first[n] = true
		}
	}
	if len(first) < 3 {
		t.Fatalf("20 nodes asked only %v first", first)
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
	stable := quorum.NewStable(1, []string{"a", "b", "c"})
	member := func(names ...string) []ViewMember {
		var v []ViewMember
		for _, n := range names {
			v = append(v, ViewMember{Name: n, Stable: stable.ID()})
		}
		return v
	}
	all := []string{"a", "b", "c", "d", "e", "f", "g"}

	far := &tracker{self: "a", stableAfter: 100, stable: stable}
	far.setView(1, member(all...), nil)
	far.setView(2, member("a", "b"), nil) // c and d..g lost to the split, no goodbye heard
	if !far.ok {
		t.Fatalf("a, with 2 of %v, counts no quorum", far.stable.Members)
	}

	near := &tracker{self: "d", stableAfter: 100, stable: stable}
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

// A stable membership replayed off the wire (the rest of
// ownership.TestReplayedGossipIsBounded, whose claims are the register's): a
// stale one heard late, and the same set twice, move nothing. Each replay
// goes through the codec, as one copied off the wire would.
func TestReplayedStableIsBounded(t *testing.T) {
	keys, _ := ownership.NewKeyring(bytes.Repeat([]byte{1}, 32))
	for _, k := range []*ownership.Keyring{nil, keys} {
		reopen := func(m gossip.Message) gossip.Message {
			t.Helper()
			m.Cluster, m.Sender = "c1", "a"
			b, err := m.Seal(k)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gossip.Open(b, m.Kind.Channel(), "c1", k)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		old, _ := gossip.NewRegister(8)
		state := reopen(gossip.Message{Kind: gossip.KindState, Stable: quorum.NewStable(2, []string{"a", "b", "c"}), Register: old})

		// A stale stable membership heard late, and the same set twice.
		q := &tracker{self: "a", stableAfter: 5, stable: quorum.NewStable(2, []string{"a", "b", "c"})}
		q.setView(1, []ViewMember{{Name: "a"}, {Name: "b"}, {Name: "c"}}, nil)
		cur := quorum.NewStable(3, []string{"a", "b", "c"})
		if !q.heard(2, reopen(gossip.Message{Kind: gossip.KindStable, Stable: cur}).Stable) {
			t.Fatal("a newer stable membership was not taken")
		}
		for _, s := range []quorum.Stable{state.Stable, cur} {
			if q.heard(3, reopen(gossip.Message{Kind: gossip.KindStable, Stable: s}).Stable) || q.stable.ID() != cur.ID() {
				t.Fatalf("replayed %v after %v: now %v", s, cur, q.stable)
			}
		}
	}
}

// Issue 22, item 4: in a join the members that see the joiner promote the
// new set and re-advertise it in their metadata, and gossip the set
// itself at the same moment. A node that saw a member's new ID before the
// set's gossip asked that member for a whole-state push/pull at once:
// about 0.85 n per join in a cluster of n (TestScale10x271's join_syncs
// was 9). When a member in step with this node (it showed this node's
// own ID) steps one version ahead, the first ask waits a retry; any other
// newer ID is still asked for at once, so a node that starts, comes back
// from a split or is still behind after the wait catches up as fast as
// before.
func TestQuorumWaitsForAStepItCanHear(t *testing.T) {
	old := quorum.NewStable(3, []string{"a", "b", "c"})
	newer := quorum.NewStable(4, []string{"a", "b", "c", "d"})
	inStep := []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: old.ID()}, {Name: "c", Stable: old.ID()}}
	stepped := slices.Clone(inStep)
	stepped[1].Stable = newer.ID() // b saw the joiner d

	q := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: old}
	q.setView(1, inStep, nil)
	q.toAsk(1)
	q.setView(2, stepped, nil)
	if !q.outdated || q.ok {
		t.Fatalf("outdated %v, quorum %v: a member shows a newer set, want outdated without a quorum", q.outdated, q.ok)
	}
	for now := uint64(2); now < 6; now++ {
		if got := q.toAsk(now); len(got) != 0 {
			t.Fatalf("tick %d: asked %v within a retry wait of b's step from this node's own set", now, got)
		}
	}
	// It hears the new set's gossip: nothing to ask for.
	if !q.heard(5, newer) {
		t.Fatal("the new set, of which this node knows a quorum, was not adopted")
	}
	joined := append(slices.Clone(stepped), ViewMember{Name: "d", Stable: newer.ID()})
	joined[0].Stable = newer.ID()
	for now := uint64(5); now < 40; now++ {
		q.setView(now, joined, nil)
		if got := q.toAsk(now); len(got) != 0 {
			t.Fatalf("tick %d: asked %v for a set this node has reached", now, got)
		}
	}

	// One that hears no gossip asks b once the wait is over, and again
	// after waits that double.
	r := &tracker{self: "c", stableAfter: 5, retry: 4, maxRetry: 16, stable: old}
	r.setView(1, inStep, nil)
	var at []uint64
	for now := uint64(2); now <= 20; now++ {
		r.setView(now, stepped, nil)
		if got := r.toAsk(now); len(got) > 0 {
			if !slices.Equal(got, []string{"b"}) {
				t.Fatalf("tick %d: asked %v, want b", now, got)
			}
			at = append(at, now)
		}
	}
	if want := []uint64{6, 10, 18}; !slices.Equal(at, want) {
		t.Fatalf("asked at ticks %v, want %v", at, want)
	}

	// A member in step may step several versions at once: it shows a
	// burst of changes as its latest (ShowTicks). That waits too, and so
	// does a step from an older set than this node's own.
	for _, c := range []struct {
		name   string
		before quorum.StableID
		after  quorum.StableID
	}{
		{"two versions", old.ID(), quorum.NewStable(5, []string{"a", "b", "c"}).ID()},
		{"from behind", quorum.NewStable(2, []string{"a", "b"}).ID(), newer.ID()},
	} {
		r := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: old}
		r.setView(1, []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: c.before}, {Name: "c", Stable: old.ID()}}, nil)
		r.asked = nil
		after := []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: c.after}, {Name: "c", Stable: old.ID()}}
		var at []uint64
		for now := uint64(2); now <= 8; now++ {
			r.setView(now, after, nil)
			if got := r.toAsk(now); len(got) > 0 {
				at = append(at, now)
			}
		}
		if want := []uint64{6}; !slices.Equal(at, want) {
			t.Errorf("%s: asked at ticks %v, want %v", c.name, at, want)
		}
	}

	// Asked at once, as before: a node with no stable membership yet (it
	// just started); a member that first shows the newer set without a step
	// from this node's own (it was not in the view: back from a split or
	// restarted); a member's first set, shown after none (it may come from
	// the far side of a split); a step from another set of this node's
	// version (the member was on a diverged side); a step while this node is still
	// behind from an earlier one (the member's last ID was newer than this
	// node's).
	for _, c := range []struct {
		name       string
		own        quorum.Stable
		before     []ViewMember
		after      []ViewMember
		wantAskOne bool
	}{
		{"no stable yet", quorum.Stable{}, []ViewMember{{Name: "a"}, {Name: "b"}}, []ViewMember{{Name: "a"}, {Name: "b", Stable: newer.ID()}}, true},
		{"new in the view", old, []ViewMember{{Name: "a", Stable: old.ID()}}, []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: newer.ID()}}, true},
		{"fresh", old, []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b"}, {Name: "c", Stable: old.ID()}},
			[]ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: newer.ID()}, {Name: "c", Stable: old.ID()}}, true},
		{"diverged", old, []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: quorum.NewStable(3, []string{"a", "b", "x"}).ID()}, {Name: "c", Stable: old.ID()}},
			[]ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: newer.ID()}, {Name: "c", Stable: old.ID()}}, true},
		{"still behind", old, stepped, []ViewMember{{Name: "a", Stable: old.ID()}, {Name: "b", Stable: quorum.NewStable(4, []string{"a", "b", "c", "e"}).ID()}, {Name: "c", Stable: old.ID()}}, true},
	} {
		r := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: c.own}
		r.setView(1, c.before, nil)
		r.asked = nil // what the first view asked for is not this case's
		r.setView(2, c.after, nil)
		if got := r.toAsk(2); len(got) != 1 {
			t.Errorf("%s: asked %v at once, want one member", c.name, got)
		}
	}
}

// QuorumState says what a missing quorum rests on: no stable membership,
// a minority reached, a member showing a newer set (outdated), a newer set
// heard of which no quorum is known (doubt), or fewer members than
// MinQuorum.
func TestQuorumStateSaysWhy(t *testing.T) {
	s3 := quorum.NewStable(3, []string{"a", "b", "c"})
	view := func(id quorum.StableID, unreachable ...string) []ViewMember {
		var v []ViewMember
		for _, n := range []string{"a", "b", "c"} {
			v = append(v, ViewMember{Name: n, Stable: id, Unreachable: slices.Contains(unreachable, n)})
		}
		return v
	}
	want := func(q *tracker, w QuorumState) {
		t.Helper()
		if got := q.state(); got != w {
			t.Fatalf("state %+v, want %+v", got, w)
		}
	}
	fresh := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16}
	fresh.setView(1, view(quorum.StableID{}), nil)
	want(fresh, QuorumState{Members: 3})

	q := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: s3}
	q.setView(1, view(s3.ID()), nil)
	want(q, QuorumState{OK: true, Reached: 3, Stable: 3, Members: 3})
	q.setView(2, view(s3.ID(), "b", "c"), nil)
	want(q, QuorumState{Reached: 1, Stable: 3, Members: 1})
	newer := quorum.NewStable(4, []string{"a", "b", "c", "d"})
	stepped := view(s3.ID())
	stepped[1].Stable = newer.ID()
	q.setView(3, stepped, nil)
	want(q, QuorumState{Outdated: true, Reached: 3, Stable: 3, Members: 3})

	d := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: s3}
	d.setView(1, view(s3.ID()), nil)
	d.heard(2, quorum.NewStable(4, []string{"a", "w", "x", "y", "z"}))
	d.setView(2, view(s3.ID()), nil)
	want(d, QuorumState{Doubt: true, Reached: 3, Stable: 3, Members: 3})

	m := &tracker{self: "a", min: 2, stableAfter: 5, retry: 4, maxRetry: 16, stable: s3}
	m.setView(1, view(s3.ID(), "b", "c"), nil)
	want(m, QuorumState{Min: 2, Reached: 1, Stable: 3, Members: 1})
	m.setView(2, view(s3.ID(), "c"), nil)
	want(m, QuorumState{OK: true, Min: 2, Reached: 2, Stable: 3, Members: 2})
}

// Issue 22: a join grows the stable membership on every node that sees
// it. The first node to promote shows the grown set's ID in its metadata;
// a node that sees that ID with the joiner already in its view holds the
// set's every name, and takes the set instead of counting itself outdated,
// without a quorum, until the set's broadcast reaches it (at 200 nodes in
// the simulator, 166 of 200 lost their quorum in one join).
func TestQuorumTakesTheNextSetAMemberShows(t *testing.T) {
	q := &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	own := q.stable.ID()
	next := quorum.NewStable(4, []string{"a", "b", "c", "d"})
	view := []ViewMember{{Name: "a", Stable: own}, {Name: "b", Stable: next.ID()}, {Name: "c", Stable: own}, {Name: "d"}}
	if !q.setView(1, view, nil) {
		t.Fatal("the stable membership did not change")
	}
	if q.stable.ID() != next.ID() || q.outdated || !q.ok {
		t.Fatalf("stable %v, outdated %v, quorum %v; want %v, not outdated, a quorum", q.stable, q.outdated, q.ok, next)
	}
	// Several versions up too: a member shows a burst of changes as its
	// latest (ShowTicks), and a node may miss one. The set taken is the
	// one shown, at its version.
	q = &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	later := quorum.NewStable(6, []string{"a", "b", "c", "d"})
	view[1].Stable = later.ID()
	if !q.setView(1, view, nil) || q.stable.ID() != later.ID() || q.outdated || !q.ok {
		t.Fatalf("stable %v, outdated %v, quorum %v; want %v, not outdated, a quorum", q.stable, q.outdated, q.ok, later)
	}
	// Not past MaxStableJump (a forged or corrupt ID), and such a member
	// does not stop the search: another that shows the set is heard.
	q = &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	far := quorum.StableID{Version: 3 + quorum.MaxStableJump + 1, Hash: later.ID().Hash}
	v := slices.Clone(view)
	v[1].Stable, v[2].Stable = far, later.ID()
	if !q.setView(1, v, nil) || q.stable.ID() != later.ID() {
		t.Fatalf("stable %v; want %v from c, past b's ID beyond MaxStableJump", q.stable, later)
	}
	view[1].Stable = next.ID()

	// Taken only from a member this node reaches, and only while it
	// reaches a majority of its own set: a member's metadata outlives it
	// (cut off, or crashed before its set's broadcast went out), and a
	// minority must not take a set that gives it a quorum.
	fresh := func() *tracker {
		return &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	}
	view[1].Unreachable = true
	q = fresh()
	q.setView(1, view, nil)
	if q.stable.ID() != own || !q.outdated {
		t.Fatalf("from an unreachable member: stable %v, outdated %v; want the old set kept, outdated", q.stable, q.outdated)
	}
	big := quorum.NewStable(3, []string{"a", "b", "c", "x", "y"}) // a reaches a and b: 2 of 5
	q = &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: big}
	grown := quorum.NewStable(4, []string{"a", "b", "d"})
	q.setView(1, []ViewMember{{Name: "a", Stable: big.ID()}, {Name: "b", Stable: grown.ID()}, {Name: "d"}}, nil)
	if q.stable.ID() != big.ID() || q.ok {
		t.Fatalf("reaching a minority of its set: stable %v, quorum %v; want %v kept, no quorum", q.stable, q.ok, big)
	}
	view[1].Unreachable = false
	// In doubt (a newer set of members it doesn't know, heard lately), it
	// takes nothing: taking a set through heard would drop the doubt.
	q = fresh()
	q.heard(0, quorum.NewStable(9, []string{"x1", "x2", "x3"}))
	q.setView(1, view, nil)
	if q.stable.ID() != own || !q.doubt || q.ok {
		t.Fatalf("in doubt: stable %v, doubt %v, quorum %v; want the old set kept, still in doubt, no quorum", q.stable, q.doubt, q.ok)
	}

	// A member that shows another set of the next version (one this node
	// can't rebuild from its view) still makes the node outdated.
	q = &tracker{self: "a", stableAfter: 5, retry: 4, maxRetry: 16, stable: quorum.NewStable(3, []string{"a", "b", "c"})}
	other := quorum.NewStable(4, []string{"a", "b", "c", "e"})
	view[1].Stable = other.ID()
	q.setView(1, view, nil)
	if q.stable.ID() != own || !q.outdated || q.ok {
		t.Fatalf("stable %v, outdated %v, quorum %v; want %v kept, outdated, no quorum", q.stable, q.outdated, q.ok, quorum.NewStable(3, []string{"a", "b", "c"}))
	}
}
