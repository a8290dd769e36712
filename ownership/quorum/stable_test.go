package quorum_test

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// A member of a stable membership is a node, whose name is an owner's: the
// two bounds are one.
func TestMaxMemberSizeIsTheOwnerBound(t *testing.T) {
	if quorum.MaxMemberSize != ownership.MaxOwnerSize {
		t.Fatalf("MaxMemberSize %d, ownership.MaxOwnerSize %d", quorum.MaxMemberSize, ownership.MaxOwnerSize)
	}
	long := strings.Repeat("x", quorum.MaxMemberSize)
	if !quorum.NewStable(1, []string{long}).Valid() {
		t.Error("a member name of MaxMemberSize bytes is refused")
	}
	if quorum.NewStable(1, []string{long + "x"}).Valid() {
		t.Error("a member name longer than MaxMemberSize is accepted")
	}
}

// Exactly half is not a quorum (see Majority).
func TestMajority(t *testing.T) {
	stable := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		seen []string
		want bool
	}{
		{[]string{"a", "b", "c"}, true},
		{[]string{"a", "b"}, false},
		{[]string{"c", "d", "x", "y"}, false},
		{nil, false},
	} {
		if got := quorum.Majority(stable, c.seen); got != c.want {
			t.Errorf("Majority(%v, %v) = %v, want %v", stable, c.seen, got, c.want)
		}
	}
	if quorum.Majority(nil, []string{"a"}) {
		t.Error("an empty stable membership has a quorum")
	}
}

// An ID is gossiped and compared across nodes and releases: its hash is
// FNV-1a (hash/fnv's New64a) over each member's name and a 0 byte after
// it, whatever the implementation.
func TestIDHashIsFNV1aOfTheNames(t *testing.T) {
	for _, members := range [][]string{{"a"}, {"a", "b", "c"}, {"node-0", "node-1"}, {"\x00", "é"}} {
		h := fnv.New64a()
		for _, m := range members {
			h.Write([]byte(m))
			h.Write([]byte{0})
		}
		s := quorum.NewStable(7, members)
		if got := s.ID(); got != (quorum.StableID{Version: 7, Hash: h.Sum64()}) {
			t.Errorf("quorum.NewStable(7, %q).ID() = %+v, want hash %#x", members, got, h.Sum64())
		}
	}
	if got := quorum.NewStable(0, nil).ID(); got != (quorum.StableID{}) {
		t.Errorf("the ID of version 0 = %+v, want zero", got)
	}
}

func BenchmarkStableID(b *testing.B) {
	names := make([]string, 100)
	for i := range names {
		names[i] = fmt.Sprintf("node-%03d", i)
	}
	s := quorum.NewStable(3, names)
	b.ReportAllocs()
	for b.Loop() {
		s.ID()
	}
}

// TestCountCountsEveryFoundName holds Count, sorted or not, with names
// repeated, to a plain count.
func TestCountCountsEveryFoundName(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	for range 2000 {
		set := make([]string, r.IntN(8))
		for i := range set {
			set[i] = fmt.Sprint(r.IntN(12))
		}
		slices.Sort(set)
		set = slices.Compact(set)
		sub := make([]string, r.IntN(8))
		for i := range sub {
			sub[i] = fmt.Sprint(r.IntN(12))
		}
		if r.IntN(2) == 0 {
			slices.Sort(sub)
		}
		want := 0
		for _, m := range sub {
			if slices.Contains(set, m) {
				want++
			}
		}
		if got := quorum.Count(sub, set); got != want {
			t.Fatalf("Count(%q, %q) = %d, want %d", sub, set, got, want)
		}
	}
}
