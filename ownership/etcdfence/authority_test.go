package etcdfence_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
)

func TestAuthorityClaims(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	a := f.Authority()
	ctx := testContext(t)
	if !a.Strict() {
		t.Fatal("the etcd authority is not strict")
	}
	na, nb := ownership.Node{Name: "a", Incarnation: 1 << 63}, ownership.Node{Name: "b", Incarnation: 5}

	ta, err := a.Claim(ctx, 9, na, ownership.Token{})
	if err != nil || !ta.Same(tok(9, 1, "a", 1<<63)) {
		t.Fatalf("first claim = %v, %v", ta, err)
	}
	// The claim is a fence: the claimant may write at once.
	if _, err := f.Do(ctx, ta, ownership.Exact, clientv3.OpPut(data+"k", "a")); err != nil {
		t.Fatalf("write under a claimed token: %v", err)
	}
	// Claiming from a stale view loses and learns the mark.
	_, err = a.Claim(ctx, 9, nb, ownership.Token{})
	ce, ok := errors.AsType[*ownership.ConflictError](err)
	if !errors.Is(err, ownership.ErrConflict) || !ok || !ce.Current.Same(ta) || ce.Partition != 9 {
		t.Fatalf("claim from a stale view = %v, want a conflict on p9 carrying %v", err, ta)
	}
	tb, err := a.Claim(ctx, 9, nb, ce.Current)
	if err != nil || !tb.Same(tok(9, 2, "b", 5)) {
		t.Fatalf("retried claim = %v, %v", tb, err)
	}
	if _, err := f.Do(ctx, ta, ownership.Exact, clientv3.OpPut(data+"k", "late")); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("write under the superseded token = %v", err)
	}
	if _, err := a.Claim(ctx, 9, na, ta); !errors.Is(err, ownership.ErrConflict) {
		t.Fatalf("claim above a superseded epoch = %v", err)
	}
	// Only the epoch of seen counts: the mark's epoch under another name.
	tc, err := a.Claim(ctx, 9, na, tok(9, 2, "someone", 0))
	if err != nil || !tc.Same(tok(9, 3, "a", 1<<63)) {
		t.Fatalf("claim from seen's epoch under another name = %v, %v", tc, err)
	}
	// A claimant that has seen more than etcd holds (keys restored from a
	// backup) claims above what it saw: no token is issued twice.
	td, err := a.Claim(ctx, 9, nb, tok(9, 7, "x", 0))
	if err != nil || !td.Same(tok(9, 8, "b", 5)) {
		t.Fatalf("claim above an epoch never minted = %v, %v; want epoch 8", td, err)
	}
	if _, err := f.Do(ctx, tc, ownership.Exact, clientv3.OpPut(data+"k", "late")); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("write under the token before the jump = %v", err)
	}
	tc = td
	// A partition never claimed the same way.
	if te, err := a.Claim(ctx, 10, na, tok(10, 4, "x", 0)); err != nil || te.Epoch != 5 {
		t.Fatalf("claim above epoch 4 of an unclaimed partition = %v, %v; want epoch 5", te, err)
	}
	for _, bad := range []struct {
		n    ownership.Node
		seen ownership.Token
	}{
		{ownership.Node{}, tc},
		{ownership.Node{Name: strings.Repeat("x", 256)}, tc},
		{na, tok(8, 3, "a", 1<<63)},
		{na, tok(9, math.MaxUint64, "b", 5)},
	} {
		if got, err := a.Claim(ctx, 9, bad.n, bad.seen); err == nil || errors.Is(err, ownership.ErrConflict) {
			t.Fatalf("Claim(%v, %v) = %v, %v; want a usage error", bad.n, bad.seen, got, err)
		}
	}
	if cur, _ := f.Current(ctx, 9); !cur.Same(tc) {
		t.Fatalf("mark = %v, want %v", cur, tc)
	}
	if got := get(t, c, data+"k"); got != "a" {
		t.Fatalf("k = %q, want a", got)
	}
}

// TestConcurrentClaims races claimants on one partition (S4): each epoch
// goes to exactly one node, epochs are dense from 1 and increase in
// real-time order, and every lost race reports ErrConflict with the mark.
func TestConcurrentClaims(t *testing.T) {
	const (
		nodes  = 8
		wins   = 5
		maxTry = 400
		part   = 11
	)
	_, f, _ := setup(t, etcdfence.Config{})
	a := f.Authority()
	ctx := testContext(t)
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
			seen, err := f.Current(ctx, part)
			if err != nil {
				errs <- err
				return
			}
			for try, won := 0, 0; won < wins; try++ {
				if try == maxTry {
					errs <- fmt.Errorf("%v won %d claims in %d tries", n, won, maxTry)
					return
				}
				start := clock.Add(1)
				got, err := a.Claim(ctx, part, n, seen)
				end := clock.Add(1)
				if ce, ok := errors.AsType[*ownership.ConflictError](err); ok {
					conflicts.Add(1)
					seen = ce.Current // what the claimant missed
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
	if cur, err := f.Current(ctx, part); err != nil || !cur.Same(owner[nodes*wins]) {
		t.Fatalf("mark = %v, %v; want the last claim %v", cur, err, owner[nodes*wins])
	}
	t.Logf("%d claims won, %d lost", len(claims), conflicts.Load())
	if conflicts.Load() == 0 {
		t.Fatal("no claim ever lost a race: the test raced nothing")
	}
}
