package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

func tok(epoch uint64, owner string) ownership.Token {
	return ownership.Token{Partition: 3, Epoch: epoch, Owner: owner, Incarnation: 1}
}

// The model on small hand-made histories: what it must accept and what it
// must flag.
func TestFencedRegisterModel(t *testing.T) {
	a, b := tok(1, "a"), tok(2, "b")
	fenceA := Record{Kind: Fence, Token: a, Out: OK, Start: 0, End: 1}
	fenceB := Record{Kind: Fence, Token: b, Out: OK, Start: 10, End: 11}
	cases := []struct {
		name  string
		recs  []Record
		legal bool
	}{
		{"owner writes then reads", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 2, End: 3},
			{Kind: Read, Token: a, Out: OK, OutToken: a, OutValue: "x", Start: 4, End: 5},
		}, true},
		{"stale write rejected after the new fence", []Record{
			fenceA, fenceB,
			{Kind: Write, Token: a, Value: "x", Out: Stale, Start: 12, End: 13},
		}, true},
		{"stale write applied after the new fence", []Record{
			fenceA, fenceB,
			{Kind: Write, Token: b, Value: "y", Out: OK, Start: 12, End: 13},
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 14, End: 15},
		}, false},
		{"a held write overlapping the fence may land before it", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 2, End: 12},
			fenceB,
		}, true},
		{"unknown write, applied", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: Unknown, Start: 2, End: 3},
			{Kind: Read, Token: a, Out: OK, OutToken: a, OutValue: "x", Start: 4, End: 5},
		}, true},
		{"unknown write, not applied", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: Unknown, Start: 2, End: 3},
			{Kind: Read, Token: a, Out: OK, Start: 4, End: 5},
		}, true},
		{"a read that misses an acknowledged write", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 2, End: 3},
			{Kind: Read, Token: a, Out: OK, Start: 4, End: 5},
		}, false},
		{"a write before any fence is not fenced", []Record{
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 2, End: 3},
		}, false},
	}
	for _, c := range cases {
		res, err := Check(c.recs, 5*time.Second, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if legal := len(res.Illegal) == 0; legal != c.legal {
			t.Errorf("%s: legal = %v, want %v", c.name, legal, c.legal)
		}
		if !c.legal && res.Visualization == "" {
			t.Errorf("%s: no visualization written", c.name)
		}
	}
}

// The skewed clock's tickers follow its rate, and a jump fires them.
func TestSkewClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := NewSkewClock()
	ticks, stop := c.NewTicker(50 * time.Millisecond)
	defer stop()
	count := func(d time.Duration) int {
		n := 0
		end := time.NewTimer(d)
		defer end.Stop()
		for {
			select {
			case <-ticks:
				n++
			case <-end.C:
				return n
			case <-ctx.Done():
				return n
			}
		}
	}
	c.SetRate(10)
	fast := count(300 * time.Millisecond) // about 60 ticks
	c.SetRate(0.1)
	slow := count(300 * time.Millisecond) // about 0 ticks
	if fast < 20 || slow > 2 {
		t.Fatalf("ticks at 10x: %d, at 0.1x: %d", fast, slow)
	}
	before := c.Now()
	c.Jump(time.Hour)
	select {
	case <-ticks:
	case <-ctx.Done():
		t.Fatal("a jump of an hour did not fire the ticker")
	}
	if d := c.Now().Sub(before); d < time.Hour {
		t.Fatalf("Now moved %v after a jump of an hour", d)
	}
}
