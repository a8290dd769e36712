package quorum_test

import (
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
