package ring

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestMatchesNaiveReferenceAndConsistent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := range 120 {
		cfg, n := randomConfig(r)
		members := randomNames(r, n)
		tab, err := New(members, cfg)
		if err != nil {
			t.Fatalf("trial %d: New(%q, %+v): %v", trial, members, cfg, err)
		}
		checkTable(t, tab, members, cfg)

		ref := naiveOwners(slices.Sorted(slices.Values(members)), cfg)
		peer := newConsistent(members, cfg)
		for p := range uint32(cfg.Partitions) {
			if tab.Owner(p) != ref[p] {
				t.Fatalf("trial %d %+v: partition %d owner %q, naive reference %q", trial, cfg, p, tab.Owner(p), ref[p])
			}
			if got, want := tab.Owner(p)+"\x00", peer.GetPartitionOwner(int(p)).String(); got != want {
				t.Fatalf("trial %d %+v: partition %d owner %q, consistent %q", trial, cfg, p, got, want)
			}
		}
		for range 50 {
			key := fmt.Appendf(nil, "key-%d", r.Uint64())
			p, owner := tab.Lookup(key)
			if int(p) != peer.FindPartitionID(key) || owner+"\x00" != peer.LocateKey(key).String() {
				t.Fatalf("Lookup(%q) = %d %q, consistent %d %q", key, p, owner, peer.FindPartitionID(key), peer.LocateKey(key))
			}
			if q, o := tab.LookupString(string(key)); q != p || o != owner || tab.Partition(key) != p || tab.PartitionString(string(key)) != p {
				t.Fatalf("string and byte lookups disagree for %q", key)
			}
		}
	}
}

func TestDeterministicUnderShuffledInput(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for range 60 {
		cfg, n := randomConfig(r)
		members := randomNames(r, n)
		a, err := New(members, cfg)
		if err != nil {
			t.Fatal(err)
		}
		shuffled := slices.Clone(members)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		b, err := New(shuffled, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if a.Fingerprint() != b.Fingerprint() || Diff(a, b) != nil {
			t.Fatalf("tables of the same set differ: fingerprints %x %x, diff %v", a.Fingerprint(), b.Fingerprint(), Diff(a, b))
		}
		for p := range uint32(cfg.Partitions) {
			if !slices.Equal(a.Replicas(p, n), b.Replicas(p, n)) {
				t.Fatalf("replicas of %d differ: %q %q", p, a.Replicas(p, n), b.Replicas(p, n))
			}
		}
	}
}

func TestNumberedNamesDoNotCollide(t *testing.T) {
	// Under a name+index virtual node key, "node1"+"10" == "node11"+"0".
	members := []string{"node1", "node11", "node110", "node2", "1", "11", "1:1", "1:"}
	tab, err := New(members, Config{Partitions: 271, VirtualNodes: 120, Load: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[uint64]bool{}
	for _, pt := range tab.ring {
		hashes[pt.hash] = true
	}
	if len(hashes) != len(members)*120 {
		t.Fatalf("%d distinct ring points, want %d", len(hashes), len(members)*120)
	}
	checkTable(t, tab, members, tab.Config())
}

func TestNewCopiesInput(t *testing.T) {
	members := []string{"b", "a", "c"}
	tab, err := New(members, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	fp := tab.Fingerprint()
	members[0] = "z"
	got := tab.Members()
	got[0] = "y"
	if !slices.Equal(tab.Members(), []string{"a", "b", "c"}) || tab.Fingerprint() != fp {
		t.Fatalf("table changed through a caller's slice: %q", tab.Members())
	}
}

func TestFingerprintDistinguishesConfigAndMembers(t *testing.T) {
	base, _ := New([]string{"a", "b"}, DefaultConfig())
	variants := []struct {
		members []string
		cfg     Config
	}{
		{[]string{"a", "c"}, DefaultConfig()},
		{[]string{"a", "b", "c"}, DefaultConfig()},
		{[]string{"ab"}, DefaultConfig()},
		{[]string{"a", "b"}, Config{Partitions: 272, VirtualNodes: 200, Load: 1.25}},
		{[]string{"a", "b"}, Config{Partitions: 271, VirtualNodes: 201, Load: 1.25}},
		{[]string{"a", "b"}, Config{Partitions: 271, VirtualNodes: 200, Load: 1.2}},
	}
	for _, v := range variants {
		tab, err := New(v.members, v.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if tab.Fingerprint() == base.Fingerprint() {
			t.Errorf("%q %+v has the fingerprint of [a b] default", v.members, v.cfg)
		}
	}
}

func TestDiffMatchesNaiveLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	owners := func(tab *Table) []string {
		out := make([]string, tab.Partitions())
		for p := range out {
			out[p] = tab.Owner(uint32(p))
		}
		return out
	}
	for range 80 {
		cfg, n := randomConfig(r)
		names := randomNames(r, n+2)
		old, err := New(names[:n], cfg)
		if err != nil {
			t.Fatal(err)
		}
		next := slices.Clone(names[1:n])
		if r.IntN(2) == 0 || len(next) == 0 {
			next = append(next, names[n:]...)
		}
		if len(next) > cfg.Partitions {
			next = next[:cfg.Partitions]
		}
		if r.IntN(5) == 0 {
			cfg.Partitions += 1 + r.IntN(10)
		}
		nt, err := New(next, cfg)
		if err != nil {
			t.Fatal(err)
		}
		want := naiveDiff(owners(old), owners(nt))
		got := Diff(old, nt)
		if len(got) != len(want) {
			t.Fatalf("Diff has %d moves, naive %d", len(got), len(want))
		}
		for i, m := range got {
			if i > 0 && got[i-1].Partition >= m.Partition {
				t.Fatalf("Diff not ascending at %d: %v", i, got)
			}
			if w := want[int(m.Partition)]; w != [2]string{m.From, m.To} {
				t.Fatalf("move %+v, naive %q", m, w)
			}
		}
	}
}

func TestDiffNilAndEqual(t *testing.T) {
	tab, err := New([]string{"a", "b", "c"}, Config{Partitions: 7, VirtualNodes: 10, Load: 1.25})
	if err != nil {
		t.Fatal(err)
	}
	all := Diff(nil, tab)
	if len(all) != 7 {
		t.Fatalf("Diff(nil, t) = %v, want 7 moves", all)
	}
	for p, m := range all {
		if m.Partition != uint32(p) || m.From != "" || m.To != tab.Owner(uint32(p)) {
			t.Fatalf("Diff(nil, t)[%d] = %+v", p, m)
		}
	}
	if gone := Diff(tab, nil); len(gone) != 7 || gone[3].To != "" || gone[3].From != tab.Owner(3) {
		t.Fatalf("Diff(t, nil) = %v", gone)
	}
	if d := Diff(tab, tab); d != nil {
		t.Fatalf("Diff(t, t) = %v, want nil", d)
	}
	if d := Diff(nil, nil); d != nil {
		t.Fatalf("Diff(nil, nil) = %v, want nil", d)
	}
}

func TestNilTable(t *testing.T) {
	var tab *Table
	if p, o := tab.Lookup([]byte("k")); p != 0 || o != "" {
		t.Fatalf("nil Lookup = %d %q", p, o)
	}
	if p, o := tab.LookupString("k"); p != 0 || o != "" {
		t.Fatalf("nil LookupString = %d %q", p, o)
	}
	if tab.Partition(nil) != 0 || tab.PartitionString("") != 0 || tab.Partitions() != 0 || tab.Len() != 0 ||
		tab.Owner(0) != "" || tab.Replicas(0, 1) != nil || tab.Members() != nil || tab.Has("a") ||
		tab.Share("a") != 0 || tab.PartitionsOf("a") != nil || tab.Config() != (Config{}) || tab.Fingerprint() != 0 {
		t.Fatal("nil Table is not empty")
	}
}

func TestOutOfRangeAndUnknown(t *testing.T) {
	tab, err := New([]string{"a", "b"}, Config{Partitions: 5, VirtualNodes: 3, Load: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{5, 1 << 31, 1<<32 - 1} {
		if tab.Owner(p) != "" || tab.Replicas(p, 2) != nil {
			t.Errorf("partition %d: Owner %q Replicas %q", p, tab.Owner(p), tab.Replicas(p, 2))
		}
	}
	if tab.Replicas(0, 0) != nil || tab.Replicas(0, -1) != nil {
		t.Error("Replicas with n < 1 is not nil")
	}
	if tab.Has("c") || tab.Share("c") != 0 || tab.PartitionsOf("c") != nil {
		t.Error("unknown member reported present")
	}
	// Load 1 with 2 members and 5 partitions: bound ceil(2.5) = 3.
	if tab.Share("a")+tab.Share("b") != 5 || max(tab.Share("a"), tab.Share("b")) != 3 {
		t.Errorf("loads %d %d, want 3 and 2", tab.Share("a"), tab.Share("b"))
	}
}

func TestReplicasWalkTheRing(t *testing.T) {
	members := []string{"a", "b", "c", "d", "e", "f"}
	tab, err := New(members, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	firstSecond := map[[2]string]bool{}
	for p := range uint32(tab.Partitions()) {
		reps := tab.Replicas(p, len(members))
		if len(reps) != len(members) || reps[0] != tab.Owner(p) {
			t.Fatalf("Replicas(%d) = %q", p, reps)
		}
		if !slices.Equal(tab.Replicas(p, 3), reps[:3]) {
			t.Fatalf("Replicas(%d, 3) is not a prefix of Replicas(%d, 6)", p, p)
		}
		firstSecond[[2]string{reps[0], reps[1]}] = true
	}
	// Each owner's partitions spread their second replica over several
	// members, unlike consistent's GetClosestN, which gives every partition
	// of an owner the same followers.
	if len(firstSecond) < 2*len(members) {
		t.Fatalf("only %d distinct (owner, second) pairs", len(firstSecond))
	}
}

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	bad := []Config{
		{},
		{Partitions: 0, VirtualNodes: 200, Load: 1.2},
		{Partitions: -1, VirtualNodes: 200, Load: 1.2},
		{Partitions: MaxPartitions + 1, VirtualNodes: 200, Load: 1.2},
		{Partitions: 271, VirtualNodes: 0, Load: 1.2},
		{Partitions: 271, VirtualNodes: MaxVirtualNodes + 1, Load: 1.2},
		{Partitions: 271, VirtualNodes: 200, Load: 0.99},
		{Partitions: 271, VirtualNodes: 200, Load: 0},
		{Partitions: 271, VirtualNodes: 200, Load: -1},
		{Partitions: 271, VirtualNodes: 200, Load: math.NaN()},
		{Partitions: 271, VirtualNodes: 200, Load: math.Inf(1)},
	}
	for _, c := range bad {
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", c, err)
		}
		if _, nerr := New([]string{"a"}, c); !errors.Is(nerr, ErrInvalidConfig) {
			t.Errorf("New with %+v = %v, want ErrInvalidConfig", c, nerr)
		}
	}
}

func TestNewRejectsBadMembers(t *testing.T) {
	cfg := Config{Partitions: 4, VirtualNodes: 10, Load: 1.25}
	cases := []struct {
		members []string
		want    error
	}{
		{nil, ErrNoMembers},
		{[]string{}, ErrNoMembers},
		{[]string{"a", ""}, ErrInvalidMember},
		{[]string{"a", "b\x00"}, ErrInvalidMember},
		{[]string{strings.Repeat("x", MaxMemberNameLen+1)}, ErrInvalidMember},
		{[]string{"a", "b", "a"}, ErrDuplicateMember},
	}
	for _, c := range cases {
		tab, err := New(c.members, cfg)
		if !errors.Is(err, c.want) || tab != nil {
			t.Errorf("New(%q) = %v, %v; want %v", c.members, tab, err, c.want)
		}
	}
	if _, err := New([]string{strings.Repeat("x", MaxMemberNameLen)}, cfg); err != nil {
		t.Errorf("name of MaxMemberNameLen bytes refused: %v", err)
	}
	many := make([]string, MaxRingSize/MaxVirtualNodes+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	if _, err := New(many, Config{Partitions: 4096, VirtualNodes: MaxVirtualNodes, Load: 1}); !errors.Is(err, ErrTooManyMembers) {
		t.Errorf("ring of more than MaxRingSize points: %v", err)
	}
}

func TestMoreMembersThanPartitions(t *testing.T) {
	members := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	cfg := Config{Partitions: 3, VirtualNodes: 50, Load: 1.25}
	tab, err := New(members, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTable(t, tab, members, cfg)
	owners := map[string]bool{}
	idle := 0
	for _, m := range members {
		switch tab.Share(m) {
		case 0:
			idle++
		case 1:
			owners[m] = true
		default:
			t.Fatalf("%q owns %d partitions, bound is 1", m, tab.Share(m))
		}
	}
	if len(owners) != 3 || idle != 7 {
		t.Fatalf("%d owners and %d idle members, want 3 and 7", len(owners), idle)
	}
	if reps := tab.Replicas(0, 10); len(reps) != 10 {
		t.Fatalf("Replicas(0, 10) = %q, want every member", reps)
	}
}

func TestThousandsOfMembers(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, tc := range []struct{ members, partitions int }{{2500, 4096}, {4000, 271}} {
		cfg := Config{Partitions: tc.partitions, VirtualNodes: 100, Load: 1}
		members := randomNames(r, tc.members)
		tab, err := New(members, cfg)
		if err != nil {
			t.Fatalf("%d members, %d partitions: %v", tc.members, tc.partitions, err)
		}
		checkTable(t, tab, members, cfg)
	}
}

func TestLookupsDoNotAllocate(t *testing.T) {
	tab, err := New([]string{"a", "b", "c"}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef")
	skey := string(key)
	var sink int
	allocs := testing.AllocsPerRun(200, func() {
		p, o := tab.Lookup(key)
		q, _ := tab.LookupString(skey)
		sink += int(p+q+tab.Partition(key)+tab.PartitionString(skey)) + len(o) + len(tab.Owner(p)) + tab.Share(o)
		if tab.Has(o) {
			sink++
		}
	})
	if allocs != 0 {
		t.Fatalf("lookups allocate %v times per run", allocs)
	}
	_ = sink
}

func TestSortPointsIsAStableSortByHash(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{0, 1, 2, 3, 100, 5000} {
		pts := make([]point, n)
		for i := range pts {
			h := r.Uint64()
			if r.IntN(3) == 0 {
				h = uint64(r.IntN(8)) << (8 * r.IntN(8)) // equal hashes and equal digits
			}
			pts[i] = point{hash: h, id: int32(i)}
		}
		want := slices.Clone(pts)
		slices.SortStableFunc(want, func(a, b point) int { return cmp.Compare(a.hash, b.hash) })
		if got := sortPoints(pts); !slices.Equal(got, want) {
			t.Fatalf("n=%d: sortPoints differs from a stable sort", n)
		}
	}
}

func TestHashCollisionGoesToLastAddedMember(t *testing.T) {
	// consistent keeps one member per hash (the last added) and lists the
	// hash once per colliding point.
	ring := []point{{1, 0}, {5, 0}, {5, 2}, {5, 3}, {9, 1}, {9, 2}}
	lastAddedWins(ring)
	want := []point{{1, 0}, {5, 3}, {5, 3}, {5, 3}, {9, 2}, {9, 2}}
	if !slices.Equal(ring, want) {
		t.Fatalf("got %v, want %v", ring, want)
	}
}

// TestLoadIsShare holds the deprecated Table.Load to Share.
func TestLoadIsShare(t *testing.T) {
	tab, err := New([]string{"a", "b", "c"}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b", "c", "d"} {
		if tab.Load(m) != tab.Share(m) {
			t.Errorf("Load(%q) = %d, Share = %d", m, tab.Load(m), tab.Share(m))
		}
	}
}

// TestRebuildIsNew holds Rebuild to New: over random changes of the member
// set (joins, leaves, both at once, a new set, bad names), the same ring,
// placement, walk starts and fingerprint, or the same error.
func TestRebuildIsNew(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, cfg := range []Config{DefaultConfig(), {Partitions: 4096, VirtualNodes: 50, Load: 1.25}, {Partitions: 7, VirtualNodes: 3, Load: 1.0}} {
		names := []string{"a", "b", "c"}
		prev, err := New(names, cfg)
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		for step := range 300 {
			switch k := r.IntN(10); {
			case k < 4: // joins
				for range 1 + r.IntN(3) {
					names = append(names, fmt.Sprintf("n%d", next))
					next++
				}
			case k < 7 && len(names) > 1: // leaves
				for range 1 + r.IntN(min(3, len(names)-1)) {
					i := r.IntN(len(names))
					names = slices.Delete(names, i, i+1)
				}
			case k < 8: // both
				i := r.IntN(len(names))
				names[i] = fmt.Sprintf("n%d", next)
				next++
			case k < 9: // another set
				names = []string{fmt.Sprintf("n%d", next), fmt.Sprintf("n%d", next+1)}
				next += 2
			default: // a bad input: the same error, prev unchanged
				bad := append(slices.Clone(names), [][]string{{""}, {names[0]}, {"x\x00"}}[r.IntN(3)]...)
				_, werr := New(bad, cfg)
				got, gerr := prev.Rebuild(bad)
				if got != nil || gerr == nil || gerr.Error() != werr.Error() {
					t.Fatalf("step %d: Rebuild(%q) = %v, %v; New: %v", step, bad, got, gerr, werr)
				}
				continue
			}
			r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			want, err := New(names, cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := prev.Rebuild(names)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if !slices.Equal(got.ring, want.ring) || !slices.Equal(got.owners, want.owners) ||
				!slices.Equal(got.start, want.start) || !slices.Equal(got.ownerIx, want.ownerIx) ||
				!slices.Equal(got.members, want.members) || got.fp != want.fp || Diff(got, want) != nil {
				t.Fatalf("step %d (%d members): Rebuild differs from New", step, len(names))
			}
			prev = got
		}
	}
	if _, err := (*Table)(nil).Rebuild([]string{"a"}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil Rebuild: %v, want ErrInvalidConfig", err)
	}
}

// TestRebuildBreaksTiesByMember: a new member's point of the same hash as a
// kept member's goes in member order, and the later member takes the hash,
// as buildRing's stable sort and lastAddedWins leave them. No real 64-bit
// collision is known, so the kept member's points are moved by hand: one
// onto the new member's first hash, one just after its second.
func TestRebuildBreaksTiesByMember(t *testing.T) {
	cfg := Config{Partitions: 5, VirtualNodes: 2, Load: 1.25}
	fresh := ringPoints([]string{"b"}, 2)
	h0, h1 := fresh[0].hash, fresh[1].hash
	if h1 == math.MaxUint64 {
		t.Fatal("b's hash is the largest: pick another name")
	}
	// "b" sorts after "a" and before "c": the tie's later member is index 1
	// either way.
	for _, kept := range []string{"a", "c"} {
		prev, err := New([]string{kept}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		prev.ring = []point{{hash: h0, id: 0}, {hash: h1 + 1, id: 0}}
		got, err := prev.Rebuild([]string{kept, "b"})
		if err != nil {
			t.Fatal(err)
		}
		b, k := int32(1), int32(0)
		if kept == "c" {
			b, k = 0, 1
		}
		want := []point{{h0, 1}, {h0, 1}, {h1, b}, {h1 + 1, k}}
		if !slices.Equal(got.ring, want) {
			t.Fatalf("kept %q: ring %v, want %v", kept, got.ring, want)
		}
	}
}

// TestRebuildBuildsAfreshOnACollision: where prev's ring has two points of
// one hash, lastAddedWins changed their members, and Rebuild must not merge
// from it.
func TestRebuildBuildsAfreshOnACollision(t *testing.T) {
	cfg := Config{Partitions: 5, VirtualNodes: 2, Load: 1.25}
	prev, err := New([]string{"a", "b"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	prev.ring[1].hash, prev.ring[1].id = prev.ring[0].hash, prev.ring[0].id // a collision, collapsed
	want, err := New([]string{"a", "b", "c"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	next := &Table{cfg: cfg, members: []string{"a", "b", "c"}}
	if next.reuseRing(prev) {
		t.Fatal("merged from a ring with a collision")
	}
	got, err := prev.Rebuild([]string{"a", "b", "c"})
	if err != nil || !slices.Equal(got.ring, want.ring) {
		t.Fatalf("Rebuild after a collision: %v, ring equal %v", err, err == nil && slices.Equal(got.ring, want.ring))
	}
}
