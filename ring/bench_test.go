package ring

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/buraksezer/consistent"
)

// The lookup benchmarks compare Table with consistent v1.0.0 on the same
// members, partitions and keys: 10 members, 271 partitions, 16-byte keys
// drawn from a pool filled before the timer starts.
const (
	benchKeys = 4096 // a power of two, so the loop masks instead of dividing
	benchMask = benchKeys - 1
)

var (
	sinkInt    int
	sinkString string
	sinkMember consistent.Member
	sinkTable  *Table
)

func benchSetup(b *testing.B) (*Table, *consistent.Consistent, [][]byte) {
	b.Helper()
	members := make([]string, 10)
	for i := range members {
		members[i] = fmt.Sprintf("node-%d", i)
	}
	cfg := DefaultConfig()
	cfg.Partitions = 271
	tab, err := New(members, cfg)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	keys := make([][]byte, benchKeys)
	for i := range keys {
		keys[i] = make([]byte, 16)
		for j := range keys[i] {
			keys[i][j] = byte(r.Uint32())
		}
	}
	return tab, newConsistent(members, cfg), keys
}

func BenchmarkLookup(b *testing.B) {
	tab, _, keys := benchSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, o := tab.Lookup(keys[i&benchMask])
		sinkInt, sinkString = int(p), o
	}
}

func BenchmarkConsistentLocateKey(b *testing.B) {
	_, c, keys := benchSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sinkMember = c.LocateKey(keys[i&benchMask])
	}
}

func BenchmarkLookupParallel(b *testing.B) {
	tab, _, keys := benchSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var (
			i int
			p uint32
			o string
		)
		for pb.Next() {
			p, o = tab.Lookup(keys[i&benchMask])
			i++
		}
		if p == 1<<31 {
			sinkString = o
		}
	})
}

func BenchmarkConsistentLocateKeyParallel(b *testing.B) {
	_, c, keys := benchSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var (
			i int
			m consistent.Member
		)
		for pb.Next() {
			m = c.LocateKey(keys[i&benchMask])
			i++
		}
		if m == nil {
			sinkMember = m
		}
	})
}

// benchBuild runs build b.N times in a sub-benchmark per size: 271 and 4096
// partitions, 10, 100 and 1000 members, DefaultConfig's virtual nodes and
// load.
func benchBuild(b *testing.B, build func(b *testing.B, names []string, cfg Config)) {
	for _, partitions := range []int{271, 4096} {
		for _, members := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("partitions=%d/members=%d", partitions, members), func(b *testing.B) {
				names := make([]string, members)
				for i := range names {
					names[i] = fmt.Sprintf("node-%d", i)
				}
				cfg := DefaultConfig()
				cfg.Partitions = partitions
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					build(b, names, cfg)
				}
			})
		}
	}
}

// BenchmarkNew is the cost of rebuilding the table after a membership change.
func BenchmarkNew(b *testing.B) {
	benchBuild(b, func(b *testing.B, names []string, cfg Config) {
		tab, err := New(names, cfg)
		if err != nil {
			b.Fatal(err)
		}
		sinkTable = tab
	})
}

// BenchmarkConsistentNew is the peer's rebuild at the same sizes. Its New
// re-sorts the whole ring after adding each member, so it grows with the
// square of the member count: the 1000-member cases take seconds per
// operation.
func BenchmarkConsistentNew(b *testing.B) {
	benchBuild(b, func(_ *testing.B, names []string, cfg Config) {
		sinkMember = newConsistent(names, cfg).GetPartitionOwner(0)
	})
}

// BenchmarkRebuild is the cost of the table after one member joins, built
// from the table before it: the coordinator's rebuild on a membership
// change. Compare BenchmarkNew at the same sizes.
func BenchmarkRebuild(b *testing.B) {
	benchBuild(b, func(b *testing.B, names []string, cfg Config) {
		b.StopTimer()
		prev, err := New(names[1:], cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		tab, err := prev.Rebuild(names)
		if err != nil {
			b.Fatal(err)
		}
		sinkTable = tab
	})
}
