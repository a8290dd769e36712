package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// xxHasher and member let consistent be built the way this package builds
// its ring: xxhash64 keys, member names suffixed with a NUL byte.
type xxHasher struct{}

func (xxHasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

type member string

func (m member) String() string { return string(m) + "\x00" }

// newConsistent builds the peer library from members in sorted order.
func newConsistent(members []string, cfg Config) *consistent.Consistent {
	names := slices.Sorted(slices.Values(members))
	ms := make([]consistent.Member, len(names))
	for i, n := range names {
		ms[i] = member(n)
	}
	return consistent.New(ms, consistent.Config{
		Hasher:            xxHasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.VirtualNodes,
		Load:              cfg.Load,
	})
}

// naiveOwners is a deliberately naive reference for placement, following the
// published bounded-load algorithm literally: a ring of formatted virtual node
// keys sorted once, a linear scan for each partition's successor point, and a
// map of loads.
func naiveOwners(members []string, cfg Config) []string {
	type vnode struct {
		hash uint64
		name string
	}
	var ring []vnode
	for _, name := range members {
		for i := range cfg.VirtualNodes {
			ring = append(ring, vnode{xxhash.Sum64String(fmt.Sprintf("%d:%s\x00", i, name)), name})
		}
	}
	sort.SliceStable(ring, func(i, j int) bool { return ring[i].hash < ring[j].hash })
	limit := math.Ceil(float64(cfg.Partitions) / float64(len(members)) * cfg.Load)
	loads := map[string]int{}
	owners := make([]string, cfg.Partitions)
	for p := range cfg.Partitions {
		key := xxhash.Sum64([]byte{byte(p), byte(p >> 8), byte(p >> 16), byte(p >> 24), 0, 0, 0, 0})
		start := 0
		for i, v := range ring {
			if v.hash >= key {
				start = i
				break
			}
		}
		for i := range ring {
			v := ring[(start+i)%len(ring)]
			if float64(loads[v.name]+1) <= limit {
				loads[v.name]++
				owners[p] = v.name
				break
			}
		}
	}
	return owners
}

// naiveDiff compares owners partition by partition.
func naiveDiff(old, new []string) map[int][2]string {
	out := map[int][2]string{}
	for p := range max(len(old), len(new)) {
		var a, b string
		if p < len(old) {
			a = old[p]
		}
		if p < len(new) {
			b = new[p]
		}
		if a != b {
			out[p] = [2]string{a, b}
		}
	}
	return out
}

// randomNames returns n distinct valid names drawn from several styles,
// including numbered names that collide under a name+index vnode scheme.
func randomNames(r *rand.Rand, n int) []string {
	seen := map[string]bool{}
	out := make([]string, 0, n)
	for len(out) < n {
		var s string
		switch r.IntN(4) {
		case 0:
			s = fmt.Sprintf("node%d", r.IntN(3*n+3))
		case 1:
			s = fmt.Sprintf("10.0.%d.%d:7946", r.IntN(256), r.IntN(256))
		case 2:
			b := make([]byte, 1+r.IntN(12))
			for i := range b {
				b[i] = byte(1 + r.IntN(255))
			}
			s = string(b)
		default:
			s = strings.Repeat("é", 1+r.IntN(4)) + fmt.Sprint(r.IntN(100))
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// randomConfig returns a valid small Config and member count.
func randomConfig(r *rand.Rand) (Config, int) {
	cfg := Config{
		Partitions:   1 + r.IntN(300),
		VirtualNodes: 1 + r.IntN(40),
		Load:         1 + r.Float64(),
	}
	if r.IntN(4) == 0 {
		cfg.Load = 1
	}
	return cfg, 1 + r.IntN(24) // sometimes more members than partitions
}

// checkTable asserts the invariants every Table must satisfy.
func checkTable(t *testing.T, tab *Table, members []string, cfg Config) {
	t.Helper()
	want := slices.Sorted(slices.Values(members))
	if got := tab.Members(); !slices.Equal(got, want) {
		t.Fatalf("Members() = %q, want %q", got, want)
	}
	if tab.Partitions() != cfg.Partitions || tab.Config() != cfg || tab.Len() != len(want) {
		t.Fatalf("Partitions %d Config %+v Len %d, want %d %+v %d",
			tab.Partitions(), tab.Config(), tab.Len(), cfg.Partitions, cfg, len(want))
	}
	limit := math.Ceil(float64(cfg.Partitions) / float64(len(want)) * cfg.Load)
	counts := map[string]int{}
	for p := range uint32(cfg.Partitions) {
		o := tab.Owner(p)
		if !tab.Has(o) {
			t.Fatalf("partition %d owned by non-member %q", p, o)
		}
		counts[o]++
	}
	total := 0
	for _, m := range want {
		if tab.Share(m) != counts[m] {
			t.Fatalf("Share(%q) = %d, counted %d", m, tab.Share(m), counts[m])
		}
		if float64(counts[m]) > limit {
			t.Fatalf("member %q owns %d partitions, bound is %v", m, counts[m], limit)
		}
		owned := tab.PartitionsOf(m)
		if len(owned) != counts[m] || !slices.IsSorted(owned) {
			t.Fatalf("PartitionsOf(%q) = %v, want %d ascending", m, owned, counts[m])
		}
		for _, p := range owned {
			if tab.Owner(p) != m {
				t.Fatalf("PartitionsOf(%q) lists %d owned by %q", m, p, tab.Owner(p))
			}
		}
		total += counts[m]
	}
	if total != cfg.Partitions {
		t.Fatalf("loads sum to %d, want %d", total, cfg.Partitions)
	}
	for _, p := range []uint32{0, uint32(cfg.Partitions / 2), uint32(cfg.Partitions - 1)} {
		for _, n := range []int{1, 2, len(want), len(want) + 3} {
			reps := tab.Replicas(p, n)
			if len(reps) != min(n, len(want)) || reps[0] != tab.Owner(p) {
				t.Fatalf("Replicas(%d, %d) = %q, owner %q", p, n, reps, tab.Owner(p))
			}
			seen := map[string]bool{}
			for _, m := range reps {
				if seen[m] || !tab.Has(m) {
					t.Fatalf("Replicas(%d, %d) = %q: repeated or unknown member", p, n, reps)
				}
				seen[m] = true
			}
		}
	}
}
