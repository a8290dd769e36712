package coordinator

import (
	"testing"
	"time"
)

func TestQuorum(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	five := []string{"a", "b", "c", "d", "e"}

	t.Run("a join grows the stable set at once", func(t *testing.T) {
		q := quorum{stableAfter: time.Minute}
		q.check(at(0), []string{"a", "b", "c", "d"})
		q.check(at(time.Second), five) // e joins
		// a and b crash: c, d, e are 3 of 5, but would be only 2 of the
		// first 4 had the join not counted.
		if !q.check(at(2*time.Second), []string{"c", "d", "e"}) {
			t.Fatal("3 of 5 has no quorum: the join did not count")
		}
		if q.check(at(3*time.Second), []string{"d", "e"}) {
			t.Fatal("2 of 5 has a quorum")
		}
	})

	t.Run("a minority losing sight one at a time never gains a quorum", func(t *testing.T) {
		q := quorum{stableAfter: 5 * time.Second}
		q.check(at(0), five)
		// d's view of a 3|2 split: the others vanish a second apart.
		views := [][]string{{"b", "c", "d", "e"}, {"c", "d", "e"}, {"d", "e"}}
		for i, v := range views {
			q.check(at(time.Duration(i+1)*time.Second), v)
		}
		for d := 4 * time.Second; d < time.Minute; d += time.Second {
			if q.check(at(d), []string{"d", "e"}) {
				t.Fatalf("the minority regained a quorum after %v", d)
			}
		}
	})

	t.Run("a graceful leave shrinks the stable set at once", func(t *testing.T) {
		q := quorum{stableAfter: time.Minute}
		q.check(at(0), five)
		q.forget("d")
		q.forget("e")
		q.check(at(time.Second), []string{"a", "b", "c"})
		// c crashes: a and b are 2 of the 3 left, though only 2 of 5 had
		// the leaves not counted.
		if !q.check(at(2*time.Second), []string{"a", "b"}) {
			t.Fatal("2 of 3 has no quorum: the leaves did not count")
		}
	})

	t.Run("a crash is followed after StableAfter", func(t *testing.T) {
		q := quorum{stableAfter: 5 * time.Second}
		q.check(at(0), five)
		three := []string{"a", "b", "c"}
		q.check(at(time.Second), three) // d and e crashed
		if q.check(at(2*time.Second), []string{"a", "b"}) {
			t.Fatal("2 of 5 has a quorum")
		}
		q.check(at(3*time.Second), three)
		q.check(at(9*time.Second), three) // unchanged for StableAfter
		if !q.check(at(10*time.Second), []string{"a", "b"}) {
			t.Fatal("2 of the promoted 3 has no quorum")
		}
	})

	t.Run("MinQuorum replaces the majority", func(t *testing.T) {
		q := quorum{min: 1, stableAfter: time.Minute}
		q.check(at(0), five)
		if !q.check(at(time.Second), []string{"e"}) {
			t.Fatal("MinQuorum 1: a lone node has no quorum")
		}
	})
}
