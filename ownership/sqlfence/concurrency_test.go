package sqlfence_test

import (
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// op is one call in a concurrent history: a fence or a fenced write.
type op struct {
	id         int
	fence      bool
	idx        int    // index of the token in the test's token list
	start, end uint64 // logical times: before the call and after it returned
	err        error
}

// TestConcurrentWriters runs many writers on many connections against one
// partition, with tokens old, current and not yet fenced, while a fencer
// advances the mark mid-way. Each write inserts a row tagged with its op.
// Afterwards the history must show that no write under a stale token
// committed, and that every write under the current token committed when
// no higher token intervened. It runs on fences with Config.Concurrent too
// (PostgreSQL's Exact writers then share the partition's row lock).
func TestConcurrentWriters(t *testing.T) {
	for b, via := range everyPath() {
		for _, m := range []ownership.Mode{ownership.Exact, ownership.Monotonic} {
			for _, conc := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/%s/concurrent=%v", b.name, via.name, m, conc), func(t *testing.T) {
					t.Parallel()
					runConcurrentWriters(t, b, via, m, sqlfence.Config{Concurrent: conc})
				})
			}
		}
	}
}

func runConcurrentWriters(t *testing.T, b backend, via path, mode ownership.Mode, cfg sqlfence.Config) {
	const (
		writers  = 12
		perGo    = 30
		fences   = 8 // tokens 1..fences are fenced in turn; token 0 first
		numToken = fences + 2
	)
	db := b.open(t)
	db.SetMaxOpenConns(writers + 2)
	f, _ := newFenceTable(t, db, b.dialect, cfg)
	ctx := testkit.Ctx(t, 60*time.Second)

	rows := uniqueName(t, db, "tenure_rows")
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE "%s" (id %s, epoch BIGINT NOT NULL, owner TEXT NOT NULL, op BIGINT NOT NULL)`, rows, b.autoID)); err != nil {
		t.Fatalf("create rows table: %v", err)
	}
	insert := fmt.Sprintf(`INSERT INTO "%s" (epoch, owner, op) VALUES ($1, $2, $3)`, rows)

	// Tokens alternate owners within an epoch, so the order also depends on
	// the owner comparison: (1,a) < (1,b) < (2,a) < ...
	toks := make([]ownership.Token, numToken)
	for i := range toks {
		toks[i] = fencetest.Tok(5, uint64(i/2+1), string(rune('a'+i%2)), uint64(i))
	}
	mustFence(t, f, toks[0])

	var (
		clock    atomic.Uint64
		fenced   atomic.Int64 // index of the last token whose fence returned
		finished atomic.Int64 // writes finished
		progress = make(chan struct{}, 1)
		fenceOps []op // appended by the fencer only
	)
	// Write ids are fixed up front so that the row can name its op.
	var nextWrite atomic.Int64
	nextWrite.Store(1 << 20)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the fencer
		defer wg.Done()
		for i := 1; i <= fences; i++ {
			target := int64(i * writers * perGo / (fences + 1))
			for finished.Load() < target {
				select {
				case <-progress:
				case <-ctx.Done():
					return
				}
			}
			o := op{fence: true, idx: i, start: clock.Add(1)}
			_, o.err = f.Fence(ctx, toks[i])
			o.end = clock.Add(1)
			fenced.Store(int64(i))
			fenceOps = append(fenceOps, o)
		}
	}()
	writes := make([]op, 0, writers*perGo)
	var wmu sync.Mutex
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range perGo {
				idx := int(fenced.Load()) + []int{-2, -1, 0, 0, 0, 0, 1}[rng.IntN(7)]
				idx = max(0, min(idx, numToken-1))
				o := op{id: int(nextWrite.Add(1)), idx: idx}
				tk := toks[idx]
				o.start = clock.Add(1)
				o.err = via.do(f, ctx, tk, mode, func(tx sqlfence.Tx) error {
					_, err := tx.ExecContext(ctx, insert, int64(tk.Epoch), tk.Owner, o.id)
					return err
				})
				o.end = clock.Add(1)
				wmu.Lock()
				writes = append(writes, o)
				wmu.Unlock()
				finished.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("test timed out: %v", ctx.Err())
	}
	checkHistory(t, db, rows, mode, toks, fenceOps, writes)
}

// checkHistory checks a concurrent history of fences and writes against
// the rows the writes committed.
func checkHistory(t *testing.T, db *sql.DB, rows string, mode ownership.Mode, toks []ownership.Token, fences, writes []op) {
	t.Helper()
	for _, o := range fences {
		if o.err != nil {
			t.Fatalf("Fence(%v): %v", toks[o.idx], o.err)
		}
	}
	// Ops that set the mark: every fence, and in Monotonic mode every
	// committed write.
	setters := append([]op(nil), fences...)
	byID := map[int]op{}
	var ok, stale, overlapped int
	for _, w := range writes {
		byID[w.id] = w
		switch {
		case w.err == nil:
			ok++
			if mode == ownership.Monotonic {
				setters = append(setters, w)
			}
		case errors.Is(w.err, ownership.ErrStaleToken) || errors.Is(w.err, ownership.ErrNotFenced):
			stale++
		default:
			t.Fatalf("write under %v failed: %v", toks[w.idx], w.err)
		}
		for _, fo := range fences {
			if fo.start < w.end && w.start < fo.end {
				overlapped++
				break
			}
		}
	}

	// The committed rows, in commit order.
	r, err := db.Query(fmt.Sprintf(`SELECT epoch, owner, op FROM "%s" ORDER BY id`, rows))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	committed := map[int]bool{}
	var prev ownership.Token
	for r.Next() {
		var (
			epoch int64
			owner string
			id    int
		)
		if err := r.Scan(&epoch, &owner, &id); err != nil {
			t.Fatal(err)
		}
		w, found := byID[id]
		if !found || committed[id] {
			t.Fatalf("row of unknown or repeated write %d", id)
		}
		committed[id] = true
		if w.err != nil {
			t.Fatalf("write under %v failed (%v) but its row committed", toks[w.idx], w.err)
		}
		x := toks[w.idx]
		if uint64(epoch) != x.Epoch || owner != x.Owner {
			t.Fatalf("row of write %d holds e%d/%s, want %v", id, epoch, owner, x)
		}
		if x.Compare(prev) < 0 {
			t.Fatalf("write under %v committed after one under %v", x, prev)
		}
		prev = x
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}

	for _, w := range writes {
		x := toks[w.idx]
		if (w.err == nil) != committed[w.id] {
			t.Fatalf("write under %v returned %v but committed=%v", x, w.err, committed[w.id])
		}
		// higherBefore: a higher token was set before w began, so w must
		// fail. higherDuring: one may have been set before w ended.
		var higherBefore, higherDuring bool
		for _, s := range setters {
			if s.err == nil && toks[s.idx].Compare(x) > 0 {
				higherBefore = higherBefore || s.end < w.start
				higherDuring = higherDuring || s.start < w.end
			}
		}
		// fencedBefore: w's own token was fenced before w began.
		fencedBefore := false
		for _, s := range fences {
			fencedBefore = fencedBefore || (s.idx == w.idx && s.end < w.start)
		}
		if w.idx == 0 {
			fencedBefore = true // fenced before the writers started
		}
		switch {
		case w.err == nil && higherBefore:
			t.Fatalf("write under %v committed after a higher token was set", x)
		case w.err == nil && mode == ownership.Exact && !fencedBefore && !fencedDuring(fences, w):
			t.Fatalf("Exact write under %v committed though it was never fenced", x)
		case w.err != nil && !higherDuring && (mode == ownership.Monotonic || fencedBefore):
			t.Fatalf("write under the current token %v failed: %v", x, w.err)
		}
	}
	t.Logf("%d writes committed, %d refused, %d overlapped a fence", ok, stale, overlapped)
	if ok == 0 || stale == 0 || overlapped == 0 {
		t.Fatalf("history too tame to test anything: %d committed, %d refused, %d overlapped a fence", ok, stale, overlapped)
	}
}

// fencedDuring reports whether w's token was fenced by a fence that began
// before w ended.
func fencedDuring(fences []op, w op) bool {
	for _, s := range fences {
		if s.idx == w.idx && s.start < w.end {
			return true
		}
	}
	return false
}
