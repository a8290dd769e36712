package ring

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzNew feeds New arbitrary member names (newline separated) and configs: it
// must return either an error wrapping one of the package's sentinels or a
// Table that satisfies every invariant.
func FuzzNew(f *testing.F) {
	f.Add("a\nb\nc", 271, 200, 1.25)
	f.Add("node1\nnode11\nnode110", 7, 3, 1.0)
	f.Add("", 271, 200, 1.25)
	f.Add("a\na", 271, 200, 1.25)
	f.Add("a\n\nb", 3, 1, 1.5)
	f.Add("x\x00y", 10, 10, 2.0)
	f.Add("a\nb\nc\nd", 3, 10, 1.25)
	f.Add("a", 0, 0, 0.0)
	f.Add("a", 1, 1, 1.0)
	f.Add("é\n\xff\xfe\n1:2", 97, 5, 1e308)
	f.Add("a\nb", -1, 20, -0.5)
	f.Fuzz(func(t *testing.T, names string, partitions, vnodes int, load float64) {
		members := strings.Split(names, "\n")
		if len(members) > 64 {
			members = members[:64]
		}
		if partitions > 1<<14 {
			partitions = 1<<14 + partitions%7
		}
		// Bounded so that each run stays fast; FuzzConfig covers the limits.
		cfg := Config{Partitions: partitions, VirtualNodes: vnodes % 1002, Load: load}
		tab, err := New(members, cfg)
		if err != nil {
			if tab != nil {
				t.Fatalf("New returned a Table and an error %v", err)
			}
			for _, sentinel := range []error{ErrInvalidConfig, ErrNoMembers, ErrTooManyMembers, ErrInvalidMember, ErrDuplicateMember} {
				if errors.Is(err, sentinel) {
					return
				}
			}
			t.Fatalf("New error %v wraps no sentinel", err)
		}
		if cfg.Validate() != nil {
			t.Fatalf("New accepted %+v, which Validate refuses", cfg)
		}
		checkTable(t, tab, members, cfg)
		shuffled := slices.Clone(members)
		slices.Reverse(shuffled)
		again, err := New(shuffled, cfg)
		if err != nil || again.Fingerprint() != tab.Fingerprint() || Diff(tab, again) != nil {
			t.Fatalf("reversed input gives a different table (err %v)", err)
		}
		// Rebuild from tab is New, for a member fewer and one more.
		for _, next := range [][]string{members[1:], append(slices.Clone(members), "new")} {
			want, werr := New(next, cfg)
			got, gerr := tab.Rebuild(next)
			if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
				t.Fatalf("Rebuild(%q): %v; New: %v", next, gerr, werr)
			}
			if werr == nil && (!slices.Equal(got.ring, want.ring) || !slices.Equal(got.owners, want.owners) || got.fp != want.fp) {
				t.Fatalf("Rebuild(%q) differs from New", next)
			}
		}
	})
}

// FuzzConfig checks that Validate accepts exactly the configs New can build a
// one-member table from, and that an accepted config never makes New panic.
func FuzzConfig(f *testing.F) {
	f.Add(271, 200, 1.25)
	f.Add(1, 1, 1.0)
	f.Add(0, 0, 0.0)
	f.Add(MaxPartitions+1, 1, 1.0)
	f.Add(5, MaxVirtualNodes+1, 1.0)
	f.Add(5, 5, 0.999999)
	f.Add(5, 5, 1e300)
	f.Fuzz(func(t *testing.T, partitions, vnodes int, load float64) {
		if partitions > 1<<14 && partitions <= MaxPartitions {
			partitions = 1 << 14 // keep each run fast
		}
		cfg := Config{Partitions: partitions, VirtualNodes: vnodes, Load: load}
		verr := cfg.Validate()
		if verr != nil && !errors.Is(verr, ErrInvalidConfig) {
			t.Fatalf("Validate error %v does not wrap ErrInvalidConfig", verr)
		}
		tab, err := New([]string{"only"}, cfg)
		if (verr == nil) != (err == nil) {
			t.Fatalf("Validate says %v but New says %v", verr, err)
		}
		if err == nil && (tab.Share("only") != partitions || tab.Owner(uint32(partitions-1)) != "only") {
			t.Fatalf("one member owns %d of %d partitions", tab.Share("only"), partitions)
		}
	})
}
