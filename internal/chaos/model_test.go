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
		// A write's Start is when it is sent to the resource (in the suite,
		// after the pause gate let it go), so a write still in flight when
		// the new owner's fence began may have landed before the fence...
		{"a write in flight across the fence may land before it", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 2, End: 12},
			fenceB,
		}, true},
		// ... and one that was sent only after the fence returned (held at
		// the gate meanwhile) may not.
		{"a write sent after the fence returned is after it", []Record{
			fenceA, fenceB,
			{Kind: Write, Token: a, Value: "x", Out: OK, Start: 12, End: 13},
		}, false},
		// With the SQL authority a claim is the fence: a write under the old
		// token is rejected from the claim on, before the new owner's Fence.
		{"a write rejected after a claim fenced", []Record{
			fenceA,
			{Kind: Fence, Token: b, Value: claimFence, Out: OK, Start: 4, End: 5},
			{Kind: Write, Token: a, Value: "x", Out: Stale, Start: 6, End: 7},
			fenceB,
		}, true},
		{"a write rejected before any higher fence", []Record{
			fenceA,
			{Kind: Write, Token: a, Value: "x", Out: Stale, Start: 6, End: 7},
			fenceB,
		}, false},
		{"a write sent after the fence returned, rejected", []Record{
			fenceA, fenceB,
			{Kind: Write, Token: a, Value: "x", Out: Stale, Start: 12, End: 13},
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

// The skewed clock's tickers follow its rate, and a jump fires them. The
// bounds are one-sided where load can only make a tick late, and 100x
// wide where they aren't.
func TestSkewClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const d = 50 * time.Millisecond
	c := NewSkewClock()
	ticks, stop := c.NewTicker(d)
	defer stop()
	next := func() time.Time {
		select {
		case <-ticks:
		case <-ctx.Done():
			t.Fatal("no tick")
		}
		return time.Now()
	}
	drain := func() {
		select {
		case <-ticks:
		default:
		}
	}

	// At rate 100, five ticks take 2.5 ms; at rate 1 they would take at
	// least 250 ms.
	c.SetRate(100)
	drain()
	start := time.Now()
	for range 5 {
		next()
	}
	if took := time.Since(start); took >= 5*d {
		t.Errorf("five ticks at rate 100 took %v, no faster than at rate 1 (%v)", took, 5*d)
	}

	// At rate 0.05 a tick comes every second of real time: after the first
	// (what was left of the interval when the rate changed), the next
	// can't come within half of that, however loaded the machine.
	c.SetRate(0.05)
	drain()
	first := next()
	if gap := next().Sub(first); gap < 10*d {
		t.Errorf("ticks %v apart at rate 0.05, want about %v", gap, 20*d)
	}
	if r := c.Rate(); r != 0.05 {
		t.Errorf("rate %v, want 0.05", r)
	}

	// Now runs at the rate too: its reading of the real time lies between
	// the ones taken around it, so its moves are bracketed exactly.
	r0 := time.Now()
	c0 := c.Now()
	r0b := time.Now()
	hold(ctx, 100*time.Millisecond)
	r1 := time.Now()
	c1 := c.Now()
	r1b := time.Now()
	moved, slack := c1.Sub(c0), time.Microsecond
	if lo, hi := r1.Sub(r0b)/20, r1b.Sub(r0)/20; moved < lo-slack || moved > hi+slack {
		t.Errorf("at rate 0.05 the clock moved %v, want within [%v, %v]", moved, lo, hi)
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
