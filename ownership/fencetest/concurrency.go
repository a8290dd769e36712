package fencetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

// testConcurrentFences races fences of many tokens on one partition: a
// fence that succeeds returns its own token, a stale answer carries a
// higher mark, the mark never falls, and it ends at the highest token.
func testConcurrentFences(t *testing.T, s *suite) {
	const fencers, each, part = 8, 10, 6
	x := s.fresh(t)
	var (
		wg  sync.WaitGroup
		top atomic.Uint64
	)
	for g := range fencers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range each {
				tk := Tok(part, uint64(rng.IntN(40)+1), fmt.Sprintf("n%d", g), uint64(g))
				mark, err := x.Fence.Fence(s.ctx, tk)
				switch {
				case err == nil && !mark.Same(tk):
					t.Errorf("Fence(%v) = %v", tk, mark)
				case err != nil && !errors.Is(err, ownership.ErrStaleToken):
					t.Errorf("Fence(%v): %v", tk, err)
				case err != nil && mark.Compare(tk) <= 0:
					t.Errorf("Fence(%v) stale against %v", tk, mark)
				}
				if cur, err := x.Current(s.ctx, part); err != nil || cur.Compare(mark) < 0 {
					t.Errorf("Current after Fence(%v) = %v, %v: below the mark %v the fence returned", tk, cur, err, mark)
				}
				for {
					m := top.Load()
					if tk.Epoch <= m || top.CompareAndSwap(m, tk.Epoch) {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	cur, err := x.Current(s.ctx, part)
	if err != nil || cur.Epoch != top.Load() {
		t.Fatalf("mark %v, %v; want the highest epoch fenced, %d", cur, err, top.Load())
	}
}

// write is one write of testConcurrentWriters: under toks[idx], of key,
// over the logical times start to end.
type write struct {
	idx        int
	key        string
	start, end uint64
	err        error
}

// testConcurrentWriters runs writers under tokens old, current and not
// yet fenced against one partition, while a fencer advances the mark.
// Then it checks the history: no write under a token applied once a higher
// token's fence (or, in Monotonic mode, write) had returned (S1); no write
// below the mark applied after the fence returned that it had been running
// across (S2: the fencer reads what such writes left right after the
// fence, and a write that reports success later must already show); in
// Exact mode, no write under a token never fenced applied; no refused
// write left its key; no applied write was lost; and a write whose token
// was the mark from its start to its end applied.
func testConcurrentWriters(t *testing.T, s *suite, mode ownership.Mode) {
	const (
		writers = 8
		perGo   = 30
		fences  = 8
		part    = 5
	)
	x := s.fresh(t)
	var toks [fences + 2]ownership.Token
	for i := range toks {
		toks[i] = Tok(part, uint64(i/2+1), string(rune('a'+i%2)), uint64(i))
	}
	s.fence(t, x, toks[0])

	var (
		clock            atomic.Uint64 // logical time: every event takes a tick
		fenced, finished atomic.Int64
		progress         = make(chan struct{}, 1)
		mu               sync.Mutex
		writes           []*write
		fenceStart       [len(toks)]uint64
		fenceEnd         [len(toks)]uint64
		absent           = map[string]int{} // key -> i: absent right after the fence of toks[i]
		wg               sync.WaitGroup
	)
	fenceEnd[0] = clock.Add(1)
	wg.Go(func() { // the fencer
		for i := 1; i <= fences; i++ {
			for finished.Load() < int64(i*writers*perGo/(fences+1)) {
				select {
				case <-progress:
				case <-s.ctx.Done():
					return
				}
			}
			fenceStart[i] = clock.Add(1)
			if _, err := x.Fence.Fence(s.ctx, toks[i]); err != nil && (mode == ownership.Exact || !errors.Is(err, ownership.ErrStaleToken)) {
				t.Errorf("Fence(%v): %v", toks[i], err)
				return
			}
			fenceEnd[i] = clock.Add(1)
			fenced.Store(int64(i))
			// What the writes under lower tokens running across the fence
			// left, as the new owner would read it.
			mu.Lock()
			var across []*write
			for _, w := range writes {
				if w.end == 0 && w.idx < i {
					across = append(across, w)
				}
			}
			mu.Unlock()
			for _, w := range across {
				v, err := x.Read(s.ctx, w.key)
				if err != nil {
					t.Errorf("Read(%q): %v", w.key, err)
					return
				}
				if v == "" {
					mu.Lock()
					absent[w.key] = i
					mu.Unlock()
				}
			}
		}
	})
	for g := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for n := range perGo {
				idx := int(fenced.Load()) + []int{-2, -1, 0, 0, 0, 0, 1}[rng.IntN(7)]
				w := &write{idx: max(0, min(idx, len(toks)-1)), key: key("w/", g, "/", n)}
				mu.Lock()
				w.start = clock.Add(1)
				writes = append(writes, w)
				mu.Unlock()
				err := x.Write(s.ctx, toks[w.idx], mode, w.key, fmt.Sprint(w.idx))
				mu.Lock()
				w.end, w.err = clock.Add(1), err
				mu.Unlock()
				finished.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() || s.ctx.Err() != nil {
		t.FailNow()
	}

	applied, refused := 0, 0
	top := 0 // the highest token a write raised the mark to
	for _, w := range writes {
		tk := toks[w.idx]
		v, err := x.Read(s.ctx, w.key)
		if err != nil {
			t.Fatalf("Read(%q): %v", w.key, err)
		}
		if w.err != nil {
			if !errors.Is(w.err, ownership.ErrStaleToken) && !errors.Is(w.err, ownership.ErrNotFenced) {
				t.Fatalf("write under %v failed: %v", tk, w.err)
			}
			refused++
			if v != "" {
				t.Fatalf("write under %v was refused (%v) but its key holds %q", tk, w.err, v)
			}
			if current(w, writes, fenceStart[:], fenceEnd[:], mode) {
				t.Fatalf("write under %v, the mark from its start (t%d) to its end (t%d), was refused: %v", tk, w.start, w.end, w.err)
			}
			continue
		}
		applied++
		if v != fmt.Sprint(w.idx) {
			t.Fatalf("write under %v applied, but its key holds %q: lost", tk, v)
		}
		for j := w.idx + 1; j < len(toks); j++ {
			if fenceEnd[j] != 0 && fenceEnd[j] < w.start {
				t.Fatalf("write under %v (t%d-t%d) applied after the fence of %v returned (t%d)", tk, w.start, w.end, toks[j], fenceEnd[j])
			}
		}
		if mode == ownership.Exact && (fenceStart[w.idx] == 0 && w.idx != 0 || fenceStart[w.idx] > w.end) {
			t.Fatalf("Exact write under %v (t%d-t%d) applied before its token was fenced", tk, w.start, w.end)
		}
		if mode == ownership.Monotonic {
			top = max(top, w.idx)
			for _, u := range writes {
				if u.err == nil && u.idx > w.idx && u.end < w.start {
					t.Fatalf("write under %v (t%d-t%d) applied after a write under %v returned (t%d)", tk, w.start, w.end, toks[u.idx], u.end)
				}
			}
		}
		if i, ok := absent[w.key]; ok {
			t.Fatalf("write under %v applied, but it was absent right after the fence of %v returned", tk, toks[i])
		}
	}
	want := toks[max(fences, top)]
	s.mark(t, x, part, want)
	t.Logf("%d writes applied, %d refused", applied, refused)
	if applied == 0 || refused == 0 {
		t.Fatalf("history too tame to test anything: %d applied, %d refused", applied, refused)
	}
}

// current reports whether w's token was the mark from w's start to its
// end: fenced before it started (or raised by a write of it that
// returned, in Monotonic mode), and no higher token fenced, or written in
// Monotonic mode, before it ended.
func current(w *write, writes []*write, fenceStart, fenceEnd []uint64, mode ownership.Mode) bool {
	if fenceEnd[w.idx] == 0 || fenceEnd[w.idx] > w.start {
		return false
	}
	for j := w.idx + 1; j < len(fenceStart); j++ {
		if fenceStart[j] != 0 && fenceStart[j] < w.end {
			return false
		}
	}
	if mode == ownership.Monotonic {
		for _, u := range writes {
			if u.idx > w.idx && u.start < w.end {
				return false
			}
		}
	}
	return true
}

// testAuthority: a strict authority's claim is a fence; a claim from a
// stale view loses with a *ownership.ConflictError carrying the mark; a
// claim above a mark the store never had (a store reset, gossip
// remembering later epochs) claims above what was seen.
func testAuthority(t *testing.T, s *suite) {
	x := s.authority(t)
	a := x.Authority
	na, nb := ownership.Node{Name: "a", Incarnation: 1 << 63}, ownership.Node{Name: "b", Incarnation: 5}
	ta, err := a.Claim(s.ctx, 9, na, ownership.Token{})
	if err != nil || !ta.Same(Tok(9, 1, "a", 1<<63)) {
		t.Fatalf("first claim = %v, %v", ta, err)
	}
	if err := x.Write(s.ctx, ta, ownership.Exact, "k", "a"); err != nil {
		t.Fatalf("write under a claimed token: %v", err)
	}
	_, err = a.Claim(s.ctx, 9, nb, ownership.Token{})
	ce, ok := errors.AsType[*ownership.ConflictError](err)
	if !errors.Is(err, ownership.ErrConflict) || !ok || !ce.Current.Same(ta) || ce.Partition != 9 {
		t.Fatalf("claim from a stale view = %v, want a conflict on p9 carrying %v", err, ta)
	}
	tb, err := a.Claim(s.ctx, 9, nb, ce.Current)
	if err != nil || !tb.Same(Tok(9, 2, "b", 5)) {
		t.Fatalf("retried claim = %v, %v", tb, err)
	}
	WantStale(t, x.Write(s.ctx, ta, ownership.Exact, "k", "late"), tb)
	// Only seen's epoch counts: the mark's epoch under another name.
	tb, err = a.Claim(s.ctx, 9, nb, Tok(9, 2, "someone", 0))
	if err != nil || !tb.Same(Tok(9, 3, "b", 5)) {
		t.Fatalf("claim from the mark's epoch under another name = %v, %v", tb, err)
	}
	if _, err := a.Claim(s.ctx, 9, na, ta); !errors.Is(err, ownership.ErrConflict) {
		t.Fatalf("claim above a superseded epoch = %v, want ErrConflict", err)
	}
	tc, err := a.Claim(s.ctx, 9, na, Tok(9, 7, "x", 0))
	if err != nil || !tc.Same(Tok(9, 8, "a", 1<<63)) {
		t.Fatalf("claim above an epoch never minted = %v, %v; want epoch 8", tc, err)
	}
	WantStale(t, x.Write(s.ctx, tb, ownership.Exact, "k", "late"), tc)
	if td, err := a.Claim(s.ctx, 12, na, Tok(12, 3, "x", 0)); err != nil || td.Epoch != 4 {
		t.Fatalf("claim above epoch 3 of a partition never fenced = %v, %v; want epoch 4", td, err)
	}
	s.mark(t, x, 9, tc)
	s.read(t, x, "k", "a")
}

// testStrictClaims races claimants on one partition (S4): each epoch goes
// to exactly one node, epochs are dense from 1 and increase in real-time
// order, and every lost race reports ErrConflict with the mark.
func testStrictClaims(t *testing.T, s *suite) {
	const (
		nodes  = 8
		wins   = 5
		maxTry = 400
		part   = 11
	)
	x := s.authority(t)
	type claim struct {
		tok        ownership.Token
		start, end uint64
	}
	var (
		clock     atomic.Uint64
		mu        sync.Mutex
		claims    []claim
		conflicts atomic.Int64
		wg        sync.WaitGroup
		errs      = make(chan error, nodes)
	)
	for i := range nodes {
		wg.Go(func() {
			n := ownership.Node{Name: fmt.Sprintf("node-%d", i), Incarnation: uint64(i) << 60}
			seen := ownership.Token{}
			for try, won := 0, 0; won < wins; try++ {
				if try == maxTry {
					errs <- fmt.Errorf("%v won %d claims in %d tries", n, won, maxTry)
					return
				}
				start := clock.Add(1)
				got, err := x.Authority.Claim(s.ctx, part, n, seen)
				end := clock.Add(1)
				if ce, ok := errors.AsType[*ownership.ConflictError](err); ok {
					conflicts.Add(1)
					seen = ce.Current
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("claim by %v: %w", n, err)
					return
				}
				won++
				seen = got
				mu.Lock()
				claims = append(claims, claim{tok: got, start: start, end: end})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	owner := map[uint64]ownership.Token{}
	for _, c := range claims {
		if prev, dup := owner[c.tok.Epoch]; dup {
			t.Fatalf("epoch %d granted twice: %v and %v", c.tok.Epoch, prev, c.tok)
		}
		owner[c.tok.Epoch] = c.tok
		for _, d := range claims {
			if c.end < d.start && c.tok.Epoch >= d.tok.Epoch {
				t.Fatalf("claim %v finished before claim %v began", c.tok, d.tok)
			}
		}
	}
	for e := uint64(1); e <= nodes*wins; e++ {
		if _, ok := owner[e]; !ok {
			t.Fatalf("epoch %d never granted: epochs are not dense", e)
		}
	}
	s.mark(t, x, part, owner[nodes*wins])
	t.Logf("%d claims won, %d lost", len(claims), conflicts.Load())
	if conflicts.Load() == 0 {
		t.Fatal("no claim ever lost a race: the test raced nothing")
	}
}
