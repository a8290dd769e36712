package fencetest

import (
	"errors"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

// testAdvance: a fence advances to a higher token, is a no-op again with
// the mark, and answers a lower token with the mark and a stale error;
// partitions are independent.
func testAdvance(t *testing.T, s *suite) {
	x := s.fresh(t)
	s.mark(t, x, 7, ownership.Token{})
	t1, t2 := Tok(7, 1, "a", 1), Tok(7, 2, "b", 2)
	for _, step := range []struct {
		fence, want ownership.Token
		stale       bool
	}{
		{fence: t1, want: t1},
		{fence: t1, want: t1}, // again: a no-op
		{fence: t2, want: t2},
		{fence: t1, want: t2, stale: true},
		{fence: Tok(7, 2, "a", 9), want: t2, stale: true}, // same epoch, lower owner
		{fence: Tok(7, 2, "b", 1), want: t2, stale: true}, // same owner, lower incarnation
		{fence: t2, want: t2},
	} {
		mark, err := x.Fence.Fence(s.ctx, step.fence)
		if step.stale {
			WantStale(t, err, step.want)
		} else if err != nil {
			t.Fatalf("Fence(%v): %v", step.fence, err)
		}
		if !mark.Same(step.want) {
			t.Fatalf("Fence(%v) = %v, want %v", step.fence, mark, step.want)
		}
		s.mark(t, x, 7, step.want)
	}
	s.mark(t, x, 8, ownership.Token{})
	s.fence(t, x, Tok(8, 1, "a", 1))
	s.mark(t, x, 7, t2)
}

// testExact: an Exact write applies only under the mark.
func testExact(t *testing.T, s *suite) {
	x := s.fresh(t)
	t1, t2, t3 := Tok(3, 1, "a", 1), Tok(3, 2, "b", 2), Tok(3, 3, "c", 3)
	wantNotFenced(t, "Exact write to an unfenced partition", x.Write(s.ctx, t1, ownership.Exact, "k", "v0"))
	s.read(t, x, "k", "")
	s.fence(t, x, t1)
	if err := x.Write(s.ctx, t1, ownership.Exact, "k", "v1"); err != nil {
		t.Fatalf("write under the mark: %v", err)
	}
	s.fence(t, x, t2)
	WantStale(t, x.Write(s.ctx, t1, ownership.Exact, "k", "late"), t2)
	wantNotFenced(t, "Exact write above the mark", x.Write(s.ctx, t3, ownership.Exact, "k", "unfenced"))
	s.read(t, x, "k", "v1")
	if err := x.Write(s.ctx, t2, ownership.Exact, "k", "v2"); err != nil {
		t.Fatalf("write under the new mark: %v", err)
	}
	s.read(t, x, "k", "v2")
	s.mark(t, x, 3, t2) // Exact writes never move the mark
}

// testMonotonic: a Monotonic write applies under any token not below the
// mark, and a higher one becomes the mark.
func testMonotonic(t *testing.T, s *suite) {
	x := s.fresh(t)
	t1, t2, t3 := Tok(4, 1, "a", 1), Tok(4, 2, "b", 2), Tok(4, 3, "c", 3)
	if err := x.Write(s.ctx, t2, ownership.Monotonic, "k", "v2"); err != nil {
		t.Fatalf("first monotonic write: %v", err)
	}
	s.mark(t, x, 4, t2)
	WantStale(t, x.Write(s.ctx, t1, ownership.Monotonic, "k", "old"), t2)
	if _, err := x.Fence.Fence(s.ctx, t1); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("Fence below a monotonic write: %v", err)
	}
	if err := x.Write(s.ctx, t2, ownership.Monotonic, "k", "v2b"); err != nil {
		t.Fatalf("monotonic write under the mark: %v", err)
	}
	if err := x.Write(s.ctx, t3, ownership.Monotonic, "k", "v3"); err != nil {
		t.Fatalf("higher monotonic write: %v", err)
	}
	s.mark(t, x, 4, t3)
	WantStale(t, x.Write(s.ctx, t2, ownership.Exact, "k", "old"), t3)
	s.read(t, x, "k", "v3")
}

// testBadInput: a write under the zero token, or in an unknown mode, is
// refused and writes nothing.
func testBadInput(t *testing.T, s *suite) {
	x := s.fresh(t)
	t1 := Tok(1, 1, "a", 1)
	s.fence(t, x, t1)
	if err := x.Write(s.ctx, ownership.Token{Partition: 1}, ownership.Monotonic, "zero", "x"); err == nil {
		t.Error("a write under the zero token applied")
	}
	if err := x.Write(s.ctx, t1, ownership.Mode(9), "mode", "x"); err == nil {
		t.Error("a write in an unknown mode applied")
	}
	s.read(t, x, "zero", "")
	s.read(t, x, "mode", "")
	s.mark(t, x, 1, t1)
}

// testVerifier: a keyed fence refuses an unauthentic token, forged or
// unsigned, with ErrBadMAC, and fences nothing for it.
func testVerifier(t *testing.T, s *suite) {
	x, keys := s.keyed(t)
	good := keys.Sign(Tok(1, 1, "good", 1))
	forged := good
	forged.Epoch = 1 << 40
	for _, bad := range []ownership.Token{Tok(1, 1<<40, "evil", 1), forged} {
		if _, err := x.Fence.Fence(s.ctx, bad); !errors.Is(err, ownership.ErrBadMAC) {
			t.Fatalf("Fence(%v) = %v, want ErrBadMAC", bad, err)
		}
		if err := x.Write(s.ctx, bad, ownership.Monotonic, "k", "x"); !errors.Is(err, ownership.ErrBadMAC) {
			t.Fatalf("Monotonic write under %v = %v, want ErrBadMAC", bad, err)
		}
	}
	s.mark(t, x, 1, ownership.Token{})
	s.read(t, x, "k", "")
	s.fence(t, x, good)
	if err := x.Write(s.ctx, good, ownership.Exact, "k", "v"); err != nil {
		t.Fatalf("write under a signed token: %v", err)
	}
	s.read(t, x, "k", "v")
}

// testSignedStaleAnswers: every stale answer of a keyed fence, a fence's
// and a write's, carries the mark with a valid MAC, so that a keyed
// cluster believes it.
func testSignedStaleAnswers(t *testing.T, s *suite) {
	x, keys := s.keyed(t)
	low, high := keys.Sign(Tok(1, 1, "a", 1)), keys.Sign(Tok(1, 2, "b", 1))
	s.fence(t, x, high)
	mark, ferr := x.Fence.Fence(s.ctx, low)
	werr := x.Write(s.ctx, low, ownership.Exact, "k", "x")
	for what, err := range map[string]error{"Fence": ferr, "Write": werr} {
		st, ok := errors.AsType[*ownership.StaleTokenError](err)
		if !ok {
			t.Fatalf("%s under a lower token: %v, want stale", what, err)
		}
		if st.Current.Compare(high) != 0 || keys.Verify(st.Current) != nil {
			t.Fatalf("%s's stale answer names %v (%v), want %v signed", what, st.Current, keys.Verify(st.Current), high)
		}
	}
	if mark.Compare(high) != 0 || keys.Verify(mark) != nil {
		t.Fatalf("Fence returned the mark %v (%v), want %v signed", mark, keys.Verify(mark), high)
	}
}
