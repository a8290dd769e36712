package machine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// A tick steps only the partitions placed here while the quorum holds
// (Tick). TestSparseTicksActAsFullTicks holds that to the old rule, a
// step of every partition every tick: two machines, one with fullTicks,
// take the same random inputs (views, ticks, claims heard, stable
// memberships, the answers to their own actions, resignations, a leave)
// and must produce the same actions and phases after every input.
func TestSparseTicksActAsFullTicks(t *testing.T) {
	const seeds = 200
	inputs := 0
	for seed := range uint64(seeds) {
		inputs += sparseTickTrial(t, seed)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d seeds, %d inputs", seeds, inputs)
}

// sparseTickTrial runs one random trial and returns the inputs it fed.
func sparseTickTrial(t *testing.T, seed uint64) int {
	r := rand.New(rand.NewPCG(seed, 0x5ca1ab1e))
	const partitions = 12
	self := ownership.Node{Name: "a", Incarnation: 7}
	names := []string{"a", "b", "c", "d"}
	cfg := MachineConfig{
		Self: self, Partitions: partitions,
		Bootstrap: r.IntN(2) == 0, Fenced: r.IntN(2) == 0, StrictAuthority: r.IntN(3) == 0,
		GraceTicks: 1 + r.IntN(4), HandoffTicks: 1 + r.IntN(4), StepDownTicks: 1 + r.IntN(4),
		StableAfterTicks: 1 + r.IntN(3), RetryTicks: 1 + r.IntN(3),
		AcquireTicks: r.IntN(4), ReleaseTicks: r.IntN(4), MaxClaims: r.IntN(3),
	}
	if r.IntN(6) == 0 {
		cfg.MinQuorum = 1 + r.IntN(3)
	}
	newMachine := func(full bool) *Machine {
		c := cfg
		c.Rand = rand.New(rand.NewPCG(seed, 1))
		m, err := NewMachine(c)
		if err != nil {
			t.Fatal(err)
		}
		m.fullTicks = full
		return m
	}
	sparse, full := newMachine(false), newMachine(true)
	var pending []Action // actions of the machines' not yet answered
	step := 0
	compare := func(what string) {
		t.Helper()
		as, af := sparse.Ready(), full.Ready()
		if !slices.EqualFunc(as, af, func(x, y Action) bool { return x.String() == y.String() }) {
			t.Fatalf("seed %d, input %d (%s): sparse ticks gave\n%v\nfull ticks gave\n%v", seed, step, what, as, af)
		}
		// Everything a later input may read, not only what shows now: a
		// step skipped leaves its mark in a partition's state first.
		for p := range sparse.parts {
			if sparse.parts[p] != full.parts[p] {
				t.Fatalf("seed %d, input %d (%s): p%d is\n%+v\nwith sparse ticks,\n%+v\nwith full ticks", seed, step, what, p, sparse.parts[p], full.parts[p])
			}
		}
		if sparse.claiming != full.claiming || sparse.noQuorum != full.noQuorum {
			t.Fatalf("seed %d, input %d (%s): claiming %d, no quorum for %d ticks with sparse ticks; %d, %d with full ticks",
				seed, step, what, sparse.claiming, sparse.noQuorum, full.claiming, full.noQuorum)
		}
		for _, a := range as {
			switch a.Kind {
			case ActClaim, ActFence, ActAcquire, ActRelease:
				pending = append(pending, a)
			}
		}
	}
	both := func(what string, f func(m *Machine)) {
		f(sparse)
		f(full)
		compare(what)
	}
	compare("start")
	token := func(p uint32, epoch uint64, owner string) ownership.Token {
		inc := uint64(1 + r.IntN(2))
		if owner == self.Name && r.IntN(4) != 0 {
			inc = self.Incarnation // else an earlier life of this node
		}
		return ownership.Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: inc}
	}
	var last View // the last view installed
	for step = range 400 {
		switch k := r.IntN(24); {
		case k < 2: // a new view
			var v View
			var placed []string
			stable := sparse.Stable().ID()
			for _, n := range names {
				if n != self.Name && r.IntN(4) == 0 {
					continue
				}
				vm := ViewMember{Name: n, Incarnation: uint64(1 + r.IntN(2)), Leaving: r.IntN(6) == 0,
					Unreachable: n != self.Name && r.IntN(6) == 0}
				if n == self.Name {
					vm.Incarnation = self.Incarnation
				} else if r.IntN(6) == 0 {
					vm.Incarnation = 0 // life unknown
				}
				switch r.IntN(4) {
				case 0: // shows nothing
				case 1:
					vm.Stable = quorum.StableID{Version: stable.Version + 1, Hash: r.Uint64()}
				default:
					vm.Stable = stable
				}
				v.Members = append(v.Members, vm)
				if !vm.Leaving {
					placed = append(placed, n)
				}
			}
			if r.IntN(5) == 0 {
				v.Left = []string{names[1+r.IntN(3)]}
			}
			if len(placed) > 0 {
				owners := make([]string, partitions)
				shift := r.IntN(2)
				for p := range owners {
					owners[p] = placed[(p+shift)%len(placed)]
				}
				v.Placement = &scriptPlacement{owners: owners, members: placed}
			}
			last = v
			both(fmt.Sprintf("view %v", v.Members), func(m *Machine) {
				if err := m.SetView(v); err != nil {
					t.Fatal(err)
				}
			})
		case k < 4 && last.Members != nil: // the same view with other metadata: stable memberships, reachability
			v := View{Placement: last.Placement, Members: slices.Clone(last.Members)}
			stable := sparse.Stable().ID()
			for i := range v.Members {
				switch r.IntN(3) {
				case 0:
					v.Members[i].Stable = stable
				case 1:
					v.Members[i].Stable = quorum.StableID{Version: stable.Version + 1, Hash: r.Uint64()}
				}
				if v.Members[i].Name != self.Name {
					v.Members[i].Unreachable = r.IntN(5) == 0
				}
			}
			// Now and then a leaver whose life is unknown comes or goes:
			// the placement and the lives known stay, the members don't.
			if i := slices.IndexFunc(v.Members, func(vm ViewMember) bool { return vm.Incarnation == 0 && vm.Leaving }); i >= 0 && r.IntN(2) == 0 {
				v.Members = slices.Delete(v.Members, i, i+1)
			} else if n := names[1+r.IntN(3)]; r.IntN(2) == 0 && !slices.ContainsFunc(v.Members, func(vm ViewMember) bool { return vm.Name == n }) {
				v.Members = append(v.Members, ViewMember{Name: n, Leaving: true})
			}
			last = v
			r.Shuffle(len(v.Members), func(i, j int) { v.Members[i], v.Members[j] = v.Members[j], v.Members[i] })
			both(fmt.Sprintf("metadata %v", v.Members), func(m *Machine) {
				if err := m.SetView(v); err != nil {
					t.Fatal(err)
				}
			})
		case k < 6: // a newer stable membership heard, now and then of a member unknown here (doubt)
			ms := slices.Clone(names[:2+r.IntN(3)])
			if r.IntN(2) == 0 {
				ms = append(ms, "e", "f")
			}
			s := quorum.NewStable(sparse.Stable().Version+uint64(1+r.IntN(2)), ms)
			both("heard stable "+s.String(), func(m *Machine) { m.HeardStable(s) })
		case k < 8: // a claim heard
			p := uint32(r.IntN(partitions))
			h := sparse.Holder(p)
			c := gossip.Claim{Token: token(p, h.Token.Epoch+uint64(r.IntN(3)), names[r.IntN(len(names))]), Released: r.IntN(3) == 0}
			both("heard "+c.Token.String(), func(m *Machine) { _, _ = m.Heard(c) })
		case k < 14 && len(pending) > 0: // an answer to one of its actions
			i := r.IntN(len(pending))
			a := pending[i]
			pending = slices.Delete(pending, i, i+1)
			answerAction(r, a, both, token)
		case k < 15: // a resignation of what it holds, if anything
			p := uint32(r.IntN(partitions))
			if _, tk := sparse.Phase(p); !tk.IsZero() {
				ended := r.IntN(2) == 0
				both("resign "+tk.String(), func(m *Machine) { _ = m.Resign(tk, ended) })
			}
		case k < 16 && r.IntN(2) == 0: // a write rejected, or a resource that lost its fence
			p := uint32(r.IntN(partitions))
			if _, tk := sparse.Phase(p); !tk.IsZero() {
				if r.IntN(2) == 0 {
					cur := token(p, tk.Epoch+1, "b")
					both("rejected "+tk.String(), func(m *Machine) { m.Rejected(tk, cur) })
				} else {
					both("notfenced "+tk.String(), func(m *Machine) { m.NotFenced(tk) })
				}
			}
		case k < 16 && r.IntN(15) == 0:
			both("leave", func(m *Machine) { m.Leave() })
		default:
			for range 1 + r.IntN(3) {
				both("tick", func(m *Machine) { m.Tick() })
			}
		}
	}
	return step + 1
}

// answerAction feeds both machines the same random answer to a.
func answerAction(r *rand.Rand, a Action, both func(string, func(*Machine)), token func(uint32, uint64, string) ownership.Token) {
	higher := func() ownership.Token {
		return token(a.Partition, a.Token.Epoch+1+uint64(r.IntN(2)), "b")
	}
	// staleOrFailed draws an answer to a fence or an Acquire: a resource
	// holding a higher token, one time in n, a failure, one in n, and
	// success otherwise.
	staleOrFailed := func(n int) error {
		switch r.IntN(n) {
		case 0:
			return &ownership.StaleTokenError{Token: a.Token, Current: higher()}
		case 1:
			return errors.New("boom")
		}
		return nil
	}
	switch a.Kind {
	case ActClaim:
		var (
			tk  ownership.Token
			err error
		)
		switch r.IntN(4) {
		case 0:
			err = &ownership.ConflictError{Partition: a.Partition, Seen: a.Token, Current: higher()}
		case 1:
			err = errors.New("boom")
		default:
			tk = token(a.Partition, a.Token.Epoch+1, "a")
		}
		both("claimed "+a.String(), func(m *Machine) { m.Claimed(a.Partition, tk, err) })
	case ActFence:
		err := staleOrFailed(4)
		both("fenced "+a.String(), func(m *Machine) { m.Fenced(a.Token, err) })
	case ActAcquire:
		err := staleOrFailed(5)
		both("acquired "+a.String(), func(m *Machine) { m.Acquired(a.Token, err) })
	case ActRelease:
		both("released "+a.String(), func(m *Machine) { m.Released(a.Token) })
	}
}

// TestMetadataViewStepsWhatAMemberChanges: a view that keeps the placement
// but makes a member live (Machine.live) must step a partition placed
// elsewhere that respects that member as a rival it could not see: it
// takes it as a live member at once, as a full step does. SetView steps
// only the partitions placed here when nothing such a step reads changed;
// the members and their lives are part of that. Two ways: a member whose
// life is unknown shows up; a member's life becomes the rival's.
func TestMetadataViewStepsWhatAMemberChanges(t *testing.T) {
	for _, c := range []struct {
		name  string
		views [][]ViewMember // after b joins, with x's entries
	}{
		{"x shows up, its life unknown", [][]ViewMember{{{Name: "x"}}}},
		{"x's life becomes the rival's", [][]ViewMember{{{Name: "x", Incarnation: 4}}, {{Name: "x", Incarnation: 5}}}},
	} {
		t.Run(c.name, func(t *testing.T) { metadataViewCase(t, c.views) })
	}
}

func metadataViewCase(t *testing.T, views [][]ViewMember) {
	cfg := twoPartitions(2)
	cfg.Fenced = true
	both, ms := sparsePair(t, cfg)
	place := func(owners ...string) Placement { return &scriptPlacement{owners: owners, members: []string{"a", "b"}} }
	self := ViewMember{Name: "a", Incarnation: 7}
	both("alone", func(m *Machine) {
		if err := m.SetView(View{Members: []ViewMember{self}, Placement: &scriptPlacement{owners: []string{"a", "a"}, members: []string{"a"}}}); err != nil {
			t.Fatal(err)
		}
	})
	both("tick", func(m *Machine) { m.Tick() })
	// Claim p0, then a fence that x, a member this node can't see, holds
	// it above, in life 5: x is a rival it respects for StableAfter (lose).
	mine := ownership.Token{Partition: 0, Epoch: 1, Owner: "a", Incarnation: 7}
	both("claimed", func(m *Machine) { m.Claimed(0, mine, nil) })
	higher := ownership.Token{Partition: 0, Epoch: 5, Owner: "x", Incarnation: 5}
	both("fenced out", func(m *Machine) { m.Fenced(mine, &ownership.StaleTokenError{Token: mine, Current: higher}) })
	if ms[0].parts[0].rivalUntil == 0 {
		t.Fatal("the setup failed: no rival respected")
	}
	// b joins and takes p0: p0 is placed elsewhere now.
	b := ViewMember{Name: "b", Incarnation: 2}
	both("b joins", func(m *Machine) {
		if err := m.SetView(View{Members: []ViewMember{self, b}, Placement: place("b", "a")}); err != nil {
			t.Fatal(err)
		}
	})
	for _, x := range views { // the placement stays
		both(fmt.Sprintf("view with %+v", x), func(m *Machine) {
			if err := m.SetView(View{Members: append([]ViewMember{self, b}, x...), Placement: place("b", "a")}); err != nil {
				t.Fatal(err)
			}
		})
	}
	if ms[1].parts[0].rivalUntil != 0 {
		t.Fatal("the reference kept respecting x as an unseen rival: the case tests nothing")
	}
}

// twoPartitions is node a's machine of two partitions, founding its
// cluster, with short timings and a long StableAfter.
func twoPartitions(stepDown int) MachineConfig {
	return MachineConfig{Self: ownership.Node{Name: "a", Incarnation: 7}, Partitions: 2, Bootstrap: true,
		GraceTicks: 2, HandoffTicks: 2, StepDownTicks: stepDown, StableAfterTicks: 50, RetryTicks: 1}
}

// sparsePair returns two machines of cfg, the second with full steps (the
// reference), and a function that feeds both the same input and fails the
// test unless their actions and partitions agree after it.
func sparsePair(t *testing.T, cfg MachineConfig) (func(string, func(*Machine)), [2]*Machine) {
	var ms [2]*Machine
	for i := range ms {
		m, err := NewMachine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m.fullTicks = i == 1
		ms[i] = m
	}
	return func(what string, f func(m *Machine)) {
		t.Helper()
		f(ms[0])
		f(ms[1])
		a0, a1 := ms[0].Ready(), ms[1].Ready()
		if !slices.EqualFunc(a0, a1, func(x, y Action) bool { return x.String() == y.String() }) {
			t.Fatalf("%s: actions %v, full steps %v", what, a0, a1)
		}
		for p := range ms[0].parts {
			if ms[0].parts[p] != ms[1].parts[p] {
				t.Fatalf("%s: p%d is\n%+v\n%+v\nwith full steps", what, p, ms[0].parts[p], ms[1].parts[p])
			}
		}
	}, ms
}

// Quorum changes inside an input that keeps the placement, the members
// and their lives (a helper's review: each of SetView's and HeardStable's
// checks of the quorum before and after could go unnoticed by the
// differential test, whose StepDownTicks is never 0). The reference steps
// every partition.
func quorumPair(t *testing.T, stepDown int) (func(string, func(*Machine)), *Machine, func(string, Placement, ...ViewMember)) {
	both, ms := sparsePair(t, twoPartitions(stepDown))
	set := func(what string, pl Placement, vms ...ViewMember) {
		both(what, func(m *Machine) {
			if err := m.SetView(View{Members: vms, Placement: pl}); err != nil {
				t.Fatal(err)
			}
		})
	}
	set("a alone", &scriptPlacement{owners: []string{"a", "a"}, members: []string{"a"}}, ViewMember{Name: "a", Incarnation: 7})
	both("tick", func(m *Machine) { m.Tick() })
	return both, ms[0], set
}

// The quorum comes back in a view that changes only a member's
// reachability, after the ring moved an Owned partition away while there
// was none: it is released, not served until it is fenced.
func TestMetadataViewQuorumBackReleases(t *testing.T) {
	both, m, set := quorumPair(t, 100)
	a, b := ViewMember{Name: "a", Incarnation: 7}, ViewMember{Name: "b", Incarnation: 2}
	bGone := b
	bGone.Unreachable = true
	here := &scriptPlacement{owners: []string{"a", "a"}, members: []string{"a", "b"}}
	moved := &scriptPlacement{owners: []string{"b", "a"}, members: []string{"a", "b"}}
	tk := ownership.Token{Partition: 0, Epoch: 1, Owner: "a", Incarnation: 7}
	both("claimed", func(m *Machine) { m.Claimed(0, tk, nil) })
	both("acquired", func(m *Machine) { m.Acquired(tk, nil) })
	set("b joins", here, a, b)
	if !m.Quorum() {
		t.Fatal("setup: no quorum with b")
	}
	set("b unreachable", here, a, bGone)
	if m.Quorum() {
		t.Fatal("setup: quorum without b")
	}
	set("p0 moves to b", moved, a, bGone)
	set("b reachable again", moved, a, b)
	if ph, _ := m.Phase(0); ph != Releasing {
		t.Fatalf("p0 is %v, want releasing", ph)
	}
}

// With StepDownTicks 0, a quorum lost in an input that keeps the
// placement ends at once a lease the ring moved away while its Acquire
// ran: a view that changes only a member's reachability, or a stable
// membership heard that this node can't confirm (doubt).
func TestQuorumLostInAnInputStepsDown(t *testing.T) {
	bGone := ViewMember{Name: "b", Incarnation: 2, Unreachable: true}
	moved := &scriptPlacement{owners: []string{"b", "a"}, members: []string{"a", "b"}}
	for _, c := range []struct {
		name string
		lose func(m *Machine) error
	}{
		{"b unreachable", func(m *Machine) error {
			return m.SetView(View{Members: []ViewMember{{Name: "a", Incarnation: 7}, bGone}, Placement: moved})
		}},
		{"a forged stable membership heard", func(m *Machine) error {
			m.HeardStable(quorum.NewStable(m.Stable().Version+1, []string{"a", "x", "y", "z"}))
			return nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			both, m, set := quorumPair(t, 0)
			tk := ownership.Token{Partition: 0, Epoch: 1, Owner: "a", Incarnation: 7}
			both("claimed", func(m *Machine) { m.Claimed(0, tk, nil) }) // Acquiring
			set("b joins, takes p0", moved, ViewMember{Name: "a", Incarnation: 7}, ViewMember{Name: "b", Incarnation: 2})
			if ph, _ := m.Phase(0); ph != Acquiring || !m.Quorum() {
				t.Fatalf("setup: p0 %v, quorum %v", ph, m.Quorum())
			}
			both(c.name, func(m *Machine) {
				if err := c.lose(m); err != nil {
					t.Fatal(err)
				}
			})
			if m.Quorum() {
				t.Fatal("setup: still a quorum")
			}
			if ph, _ := m.Phase(0); ph != Unowned {
				t.Fatalf("p0 is %v, want given back", ph)
			}
		})
	}
}

// zeroPrint is a placement whose fingerprint is 0, as a nil one's is.
type zeroPrint struct{ scriptPlacement }

func (zeroPrint) Fingerprint() uint64 { return 0 }

// A placement after none is a new view even when its fingerprint is 0, a
// nil placement's (a helper's review): else the partitions placed here,
// computed once per view, stay those of no placement, and none is
// claimed.
func TestPlacementAfterNoneIsANewView(t *testing.T) {
	both, ms := sparsePair(t, twoPartitions(2))
	a := ViewMember{Name: "a", Incarnation: 7}
	both("no placement", func(m *Machine) {
		if err := m.SetView(View{Members: []ViewMember{a}}); err != nil {
			t.Fatal(err)
		}
	})
	both("tick", func(m *Machine) { m.Tick() })
	both("placed", func(m *Machine) {
		if err := m.SetView(View{Members: []ViewMember{a}, Placement: &zeroPrint{scriptPlacement{owners: []string{"a", "a"}, members: []string{"a"}}}}); err != nil {
			t.Fatal(err)
		}
	})
	both("tick", func(m *Machine) { m.Tick() })
	if ph, _ := ms[0].Phase(0); ph == Unowned {
		t.Fatal("p0, placed here, was never claimed")
	}
}
