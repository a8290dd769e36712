package coordinator

import (
	"math/rand/v2"
	"testing"
)

// Issue 11, defect 3: the incarnation was drawn from Config.Rand, so two
// lives of a node built with the same seed (a test harness, a replayed
// simulation, a program that seeds from its name) shared tokens (S3). The
// incarnation must come from a source that never repeats, whatever Rand
// is.
func TestSeededRandDoesNotRepeatIncarnations(t *testing.T) {
	seen := map[uint64]int{}
	for life := range 8 {
		cfg := LocalConfig()
		cfg.Name = "n0"
		cfg.Handler = HandlerFuncs{}
		cfg.Rand = rand.New(rand.NewPCG(42, 42)) // the same seed every life
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		inc := c.Self().Incarnation
		c.Close()
		if prev, ok := seen[inc]; ok {
			t.Fatalf("lives %d and %d of n0, both seeded 42, share incarnation %016x", prev, life, inc)
		}
		seen[inc] = life
	}
}
