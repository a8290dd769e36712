package etcdfence_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// TestConcurrentWriters runs many writers against one partition, with
// tokens old, current and not yet fenced, while a fencer advances the mark
// mid-way. Then it checks the history etcd keeps: every write that
// applied did so at a revision where its token was the mark (S1, in
// either mode), no write that failed left a key, and the mark only ever
// rose.
func TestConcurrentWriters(t *testing.T) {
	for _, m := range []ownership.Mode{ownership.Exact, ownership.Monotonic} {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			runConcurrentWriters(t, m)
		})
	}
}

func runConcurrentWriters(t *testing.T, mode ownership.Mode) {
	const (
		writers  = 8
		perGo    = 30
		fences   = 8
		numToken = fences + 2
		part     = 5
	)
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testkit.Ctx(t, 60*time.Second)
	toks := make([]ownership.Token, numToken)
	for i := range toks {
		toks[i] = fencetest.Tok(part, uint64(i/2+1), string(rune('a'+i%2)), uint64(i))
	}
	mustFence(t, f, toks[0])

	type write struct {
		idx int
		rev int64 // the revision it applied at
		err error
	}
	var (
		fenced, finished atomic.Int64
		progress         = make(chan struct{}, 1)
		mu               sync.Mutex
		writes           = map[string]write{}
		wg               sync.WaitGroup
	)
	wg.Go(func() { // the fencer
		for i := 1; i <= fences; i++ {
			for finished.Load() < int64(i*writers*perGo/(fences+1)) {
				select {
				case <-progress:
				case <-ctx.Done():
					return
				}
			}
			if _, err := f.Fence(ctx, toks[i]); err != nil {
				t.Errorf("Fence(%v): %v", toks[i], err)
				return
			}
			fenced.Store(int64(i))
		}
	})
	for g := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for n := range perGo {
				idx := int(fenced.Load()) + []int{-2, -1, 0, 0, 0, 0, 1}[rng.IntN(7)]
				idx = max(0, min(idx, numToken-1))
				key := fmt.Sprintf("%sw/%d/%d", data, g, n)
				resp, err := f.Do(ctx, toks[idx], mode, clientv3.OpPut(key, strconv.Itoa(idx)))
				w := write{idx: idx, err: err}
				if err == nil {
					w.rev = resp.Header.Revision
				}
				mu.Lock()
				writes[key] = w
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
	if t.Failed() || ctx.Err() != nil {
		t.FailNow()
	}

	fk := f.Prefix() + "p/" + strconv.Itoa(part)
	markAt := func(rev int64) (ownership.Token, int64) {
		resp, err := c.Get(ctx, fk, clientv3.WithRev(rev))
		if err != nil {
			t.Fatalf("get %s at %d: %v", fk, rev, err)
		}
		if len(resp.Kvs) == 0 {
			return ownership.Token{}, 0
		}
		mark, err := ownership.ParseToken(resp.Kvs[0].Value)
		if err != nil {
			t.Fatalf("mark at %d: %v", rev, err)
		}
		return mark, resp.Kvs[0].ModRevision
	}
	var ok, refused int
	for key, w := range writes {
		x := toks[w.idx]
		if w.err != nil {
			if !errors.Is(w.err, ownership.ErrStaleToken) && !errors.Is(w.err, ownership.ErrNotFenced) {
				t.Fatalf("write under %v failed: %v", x, w.err)
			}
			refused++
			if v := get(t, c, key); v != "" {
				t.Fatalf("write under %v failed (%v) but its key holds %q", x, w.err, v)
			}
			continue
		}
		ok++
		if mark, _ := markAt(w.rev); !mark.Same(x) {
			t.Fatalf("write under %v applied at revision %d, where the mark was %v", x, w.rev, mark)
		}
	}
	// The mark's history, newest first, only falls.
	mark, rev := markAt(0)
	for versions := 1; ; versions++ {
		prev, prevRev := markAt(rev - 1)
		if prevRev == 0 {
			t.Logf("%d writes applied, %d refused; the mark took %d values", ok, refused, versions)
			break
		}
		if prev.Compare(mark) >= 0 {
			t.Fatalf("the mark went from %v (revision %d) to %v (revision %d)", prev, prevRev, mark, rev)
		}
		mark, rev = prev, prevRev
	}
	if ok == 0 || refused == 0 {
		t.Fatalf("history too tame to test anything: %d applied, %d refused", ok, refused)
	}
}
