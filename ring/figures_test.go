package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// movementFigures averages, over sets random sets of 10 members, the fraction
// of partitions that change owner when an 11th member joins divided by the
// ideal 1/11, the fraction that change when one of the 10 leaves divided by
// 1/10, and the busiest member's load over the average load (also its worst
// case over the sets).
func movementFigures(t *testing.T, cfg Config, sets int, seed uint64) (join, leave, maxOverAvg, worst float64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	build := func(members []string) *Table {
		tab, err := New(members, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return tab
	}
	moved := func(a, b *Table) float64 { return float64(len(Diff(a, b))) / float64(cfg.Partitions) }
	for range sets {
		names := randomNames(r, 11)
		ten := build(names[:10])
		k := r.IntN(10)
		join += moved(ten, build(names)) * 11
		leave += moved(ten, build(slices.Delete(slices.Clone(names[:10]), k, k+1))) * 10
		busiest := 0
		for _, m := range names[:10] {
			busiest = max(busiest, ten.Share(m))
		}
		ratio := float64(busiest) / (float64(cfg.Partitions) / 10)
		maxOverAvg += ratio
		worst = max(worst, ratio)
	}
	n := float64(sets)
	return join / n, leave / n, maxOverAvg / n, worst
}

// TestFigures prints the movement and balance figures of DefaultConfig and,
// for comparison, of consistent's own defaults (20 virtual nodes, load 1.25).
func TestFigures(t *testing.T) {
	const sets = 200
	join, leave, avg, worst := movementFigures(t, DefaultConfig(), sets, 7)
	fmt.Printf("figure: movement.join.ratio %.3f\n", join)
	fmt.Printf("figure: movement.leave.ratio %.3f\n", leave)
	fmt.Printf("figure: load.max_over_avg %.3f\n", avg)
	fmt.Printf("figure: load.max_over_avg.worst %.3f\n", worst)
	if join > 1.10 || leave > 1.10 {
		t.Errorf("movement ratios join %.3f leave %.3f, target <= 1.10", join, leave)
	}
	if avg > 1.25 {
		t.Errorf("busiest member owns on average %.3f x the average load, target <= 1.25", avg)
	}
	// The bound itself: ceil(27.1 x Load) partitions.
	if bound := math.Ceil(27.1*DefaultConfig().Load) / 27.1; worst > bound {
		t.Errorf("busiest member owns %.3f x the average load, above the bound %.3f", worst, bound)
	}

	peer := Config{Partitions: 271, VirtualNodes: 20, Load: 1.25}
	join, leave, avg, worst = movementFigures(t, peer, sets, 7)
	fmt.Printf("figure: consistent_defaults.movement.join.ratio %.3f\n", join)
	fmt.Printf("figure: consistent_defaults.movement.leave.ratio %.3f\n", leave)
	fmt.Printf("figure: consistent_defaults.load.max_over_avg %.3f\n", avg)
	fmt.Printf("figure: consistent_defaults.load.max_over_avg.worst %.3f\n", worst)
}
