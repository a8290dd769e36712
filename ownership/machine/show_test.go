package machine

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// Issue 22: every join changed every node's stable membership, and every
// node showed each change in its metadata at once: at 100 nodes, 102
// metadata updates per join, each handled and passed on by every member.
// A node shows its first stable membership at once, a change after
// ShowTicks without a show at once, and a burst of changes within
// ShowTicks as its latest, once ShowTicks have passed since the last show
// (MachineConfig.ShowTicks).
func TestShowsABurstAsItsLatest(t *testing.T) {
	const every = 4
	m, err := NewMachine(MachineConfig{Self: ownership.Node{Name: "a", Incarnation: 1}, Partitions: 1, Bootstrap: true,
		StableAfterTicks: 50, ShowTicks: every})
	if err != nil {
		t.Fatal(err)
	}
	var shown []quorum.StableID
	var at []uint64
	drain := func() {
		for _, a := range m.Ready() {
			if a.Kind == ActShow {
				shown, at = append(shown, a.Stable.ID()), append(at, m.Now())
			}
		}
	}
	drain()
	if len(shown) != 1 || shown[0] != m.Stable().ID() {
		t.Fatalf("shown %v at start, want the bootstrap set %v at once", shown, m.Stable().ID())
	}
	// One join per tick, each a fresh member: the stable set grows by the
	// join rule at every one.
	names := []string{"a"}
	view := func() View {
		var vms []ViewMember
		for i, n := range names {
			vms = append(vms, ViewMember{Name: n, Incarnation: uint64(i + 1)})
		}
		vms[0].Stable = m.Stable().ID()
		return View{Members: vms, Placement: &scriptPlacement{owners: []string{"a"}, members: slices.Clone(names)}}
	}
	for i := range 10 {
		names = append(names, fmt.Sprintf("n%d", i))
		if err := m.SetView(view()); err != nil {
			t.Fatal(err)
		}
		drain()
		m.Tick()
		drain()
	}
	if got := len(m.Stable().Members); got != 11 {
		t.Fatalf("stable set of %d members, want the 11 joined", got)
	}
	if shown[len(shown)-1] == m.Stable().ID() {
		t.Fatalf("shows at ticks %v: the burst's last change, at tick %d, was shown at once", at, m.Now())
	}
	for i := 1; i < len(at); i++ {
		if at[i]-at[i-1] < every {
			t.Fatalf("shows at ticks %v: two within %d ticks", at, every)
		}
	}
	for range every {
		m.Tick()
		drain()
	}
	if last := shown[len(shown)-1]; last != m.Stable().ID() {
		t.Fatalf("last shown %v, %d ticks after the burst; want its latest %v", last, every, m.Stable().ID())
	}
	if len(shown) > 1+10/every+1 {
		t.Fatalf("%d shows for 10 changes over 10 ticks, want at most one per %d ticks", len(shown), every)
	}
	// A change after a quiet spell is shown at once.
	for range every {
		m.Tick()
		drain()
	}
	n := len(shown)
	names = append(names, "late")
	if err := m.SetView(view()); err != nil {
		t.Fatal(err)
	}
	drain()
	if len(shown) != n+1 || shown[n] != m.Stable().ID() {
		t.Fatalf("after a quiet spell: shown %v, want %v at once", shown[n:], m.Stable().ID())
	}
}

// ShowTicks may be at most StableAfterTicks/2, so that a promotion (a
// view unchanged for StableAfterTicks) is shown at once.
func TestShowTicksAtMostHalfStableAfter(t *testing.T) {
	for _, c := range []struct {
		show, stableAfter int
		ok                bool
	}{
		{0, 0, true}, {0, 10, true}, {5, 10, true}, {6, 10, false}, {1, 0, false}, {1, 1, false}, {1, 2, true},
	} {
		_, err := NewMachine(MachineConfig{Self: ownership.Node{Name: "a"}, Partitions: 1, ShowTicks: c.show, StableAfterTicks: c.stableAfter})
		if (err == nil) != c.ok {
			t.Errorf("ShowTicks %d, StableAfterTicks %d: error %v, want ok %v", c.show, c.stableAfter, err, c.ok)
		}
	}
}
