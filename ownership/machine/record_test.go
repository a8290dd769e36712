package machine

import (
	"errors"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// The machine is the one record of claims (issue 21): Heard records a claim
// in the register and says whether it was new there, so the shell passes
// on only those; a claim that jumps too far is refused and reaches neither
// the register nor the machine; a claim the machine publishes is in the
// register before the shell performs ActPublish.
func TestMachineRecordsClaimsInItsRegister(t *testing.T) {
	reg, err := gossip.NewRegister(2)
	if err != nil {
		t.Fatal(err)
	}
	self := ownership.Node{Name: "a", Incarnation: 1}
	m, err := NewMachine(MachineConfig{Self: self, Partitions: 2, Bootstrap: true, Register: reg})
	if err != nil {
		t.Fatal(err)
	}
	if m.Register() != reg {
		t.Fatal("Register() is not MachineConfig.Register")
	}
	b1 := gossip.Claim{Token: ownership.Token{Partition: 1, Epoch: 1, Owner: "b", Incarnation: 1}}
	heard := func(c gossip.Claim, wantNew bool) {
		t.Helper()
		isNew, err := m.Heard(c)
		if err != nil || isNew != wantNew {
			t.Fatalf("Heard(%v) = %v, %v; want %v, nil", c, isNew, err, wantNew)
		}
	}
	heard(b1, true)
	heard(b1, false) // known: not passed on again
	b1r := b1
	b1r.Released = true
	heard(b1r, true) // a release ranks above its grant
	heard(b1, false) // lower than what is held
	if got := reg.GetClaim(1); got != b1r {
		t.Fatalf("register holds %v for p1, want %v", got, b1r)
	}
	if got := m.Holder(1); got != b1r {
		t.Fatalf("machine's holder of p1 is %v, want %v", got, b1r)
	}
	heard(gossip.Claim{}, false)                                                                           // zero: ignored
	heard(gossip.Claim{Token: ownership.Token{Partition: 2, Epoch: 1, Owner: "b", Incarnation: 1}}, false) // out of range

	jump := gossip.Claim{Token: ownership.Token{Partition: 1, Epoch: 2 + gossip.MaxEpochJump, Owner: "c", Incarnation: 1}}
	if isNew, err := m.Heard(jump); isNew || !errors.Is(err, ownership.ErrMalformedToken) {
		t.Fatalf("Heard(a jump of more than MaxEpochJump) = %v, %v; want false, ErrMalformedToken", isNew, err)
	}
	if got := reg.GetClaim(1); got != b1r {
		t.Fatalf("a refused claim changed the register: %v", got)
	}
	if got := m.Holder(1); got != b1r {
		t.Fatalf("a refused claim reached the machine: holder %v", got)
	}

	// The machine's own claims: in the register when ActPublish is handed
	// out, New when they changed it.
	m.Ready()
	if err := m.SetView(View{Members: []ViewMember{{Name: "a"}}, Placement: &scriptPlacement{owners: []string{"a", "a"}, members: []string{"a"}}}); err != nil {
		t.Fatal(err)
	}
	var claim Action
	for _, a := range m.Ready() {
		if a.Kind == ActClaim && a.Partition == 0 {
			claim = a
		}
	}
	if claim.Kind == 0 {
		t.Fatal("no claim of p0 after the view placed it here")
	}
	a0 := ownership.Token{Partition: 0, Epoch: 1, Owner: "a", Incarnation: 1}
	m.Claimed(0, a0, nil)
	pub := slices.IndexFunc(m.Ready(), func(a Action) bool { return a.Kind == ActPublish })
	if pub < 0 {
		t.Fatal("no ActPublish after the claim succeeded")
	}
	if got := reg.Get(0); got != a0 {
		t.Fatalf("register holds %v for p0 after ActPublish of %v", got, a0)
	}
	if isNew, _ := m.Heard(gossip.Claim{Token: a0}); isNew {
		t.Fatal("the machine's own published claim heard back counts as new")
	}
}

// A claim minted into the register before the machine publishes it (a
// gossip authority records what it mints) is not New: the shell tells its
// subscribers of a holder change once.
func TestPublishOfAMintedClaimIsNotNew(t *testing.T) {
	reg, _ := gossip.NewRegister(1)
	self := ownership.Node{Name: "a", Incarnation: 1}
	m, err := NewMachine(MachineConfig{Self: self, Partitions: 1, Bootstrap: true, Register: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetView(View{Members: []ViewMember{{Name: "a"}}, Placement: &scriptPlacement{owners: []string{"a"}, members: []string{"a"}}}); err != nil {
		t.Fatal(err)
	}
	m.Ready()
	a1 := ownership.Token{Partition: 0, Epoch: 1, Owner: "a", Incarnation: 1}
	reg.Observe(a1) // what the authority minted
	m.Claimed(0, a1, nil)
	for _, a := range m.Ready() {
		if a.Kind == ActPublish && a.New {
			t.Fatalf("%v: New, but the register held the claim already", a)
		}
	}
}

func TestMachineConfigRegisterMustMatch(t *testing.T) {
	reg, _ := gossip.NewRegister(3)
	_, err := NewMachine(MachineConfig{Self: ownership.Node{Name: "a"}, Partitions: 2, Register: reg})
	if err == nil {
		t.Fatal("a register of 3 partitions was accepted for a machine of 2")
	}
	m, err := NewMachine(MachineConfig{Self: ownership.Node{Name: "a"}, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r := m.Register(); r == nil || r.Partitions() != 2 {
		t.Fatalf("without MachineConfig.Register the machine has register %v", r)
	}
}

// BuildView is the one place a view is decided (the coordinator's loop and
// the simulator both call it): members sorted by name, the ring over the
// members not leaving, and no ring when every member is leaving.
func TestBuildView(t *testing.T) {
	members := []ViewMember{{Name: "c"}, {Name: "a", Leaving: true}, {Name: "b", Unreachable: true}}
	var asked []string
	p := &scriptPlacement{owners: []string{"b"}}
	v := BuildView(members, []string{"d"}, func(names []string) Placement { asked = names; return p })
	var names []string
	for _, m := range v.Members {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{"a", "b", "c"}) || !v.Members[1].Unreachable || !v.Members[0].Leaving {
		t.Fatalf("members %+v, want a (leaving), b (unreachable), c in that order", v.Members)
	}
	if !slices.Equal(asked, []string{"b", "c"}) || v.Placement != p {
		t.Fatalf("placed on %v (placement %v), want b, c", asked, v.Placement)
	}
	if !slices.Equal(v.Left, []string{"d"}) {
		t.Fatalf("left %v, want d", v.Left)
	}
	if members[0].Name != "c" {
		t.Fatal("BuildView reordered the caller's slice")
	}
	called := false
	v = BuildView([]ViewMember{{Name: "a", Leaving: true}}, nil, func([]string) Placement { called = true; return p })
	if called || v.Placement != nil {
		t.Fatalf("every member leaving: place called %v, placement %v; want neither", called, v.Placement)
	}
}
