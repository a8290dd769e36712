package ownership

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
)

func memTok(p uint32, epoch uint64, owner string) Token {
	return Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: epoch * 7}
}

func wantStale(t *testing.T, err error, current Token) {
	t.Helper()
	var se *StaleTokenError
	if !errors.Is(err, ErrStaleToken) || !errors.As(err, &se) {
		t.Fatalf("got %v, want a stale token error", err)
	}
	if se.Current != current {
		t.Fatalf("stale error carries %v, want %v", se.Current, current)
	}
}

func TestMemoryFenceSemantics(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	f, err := NewMemoryFence(4)
	if err != nil {
		t.Fatal(err)
	}
	t1, t2, t3 := memTok(1, 1, "a"), memTok(1, 2, "b"), memTok(1, 3, "c")

	// A fresh partition: the mark is zero and accepts no write.
	if got := f.Current(1); !got.IsZero() {
		t.Fatalf("fresh mark %v", got)
	}
	wantStale(t, f.Check(Token{Partition: 1}, Exact), Token{})
	wantStale(t, f.Check(Token{Partition: 1}, Monotonic), Token{})
	if err := f.Check(t1, Exact); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("Exact check above the mark: %v", err)
	}

	// Fence advances; the same token again is a no-op; lower is stale.
	if got, err := f.Fence(ctx, t2); err != nil || got != t2 {
		t.Fatalf("Fence(t2) = %v, %v", got, err)
	}
	if got, err := f.Fence(ctx, t2); err != nil || got != t2 {
		t.Fatalf("Fence(t2) again = %v, %v", got, err)
	}
	got, err := f.Fence(ctx, t1)
	wantStale(t, err, t2)
	if got != t2 {
		t.Fatalf("stale Fence returned %v", got)
	}
	if err := f.Check(t2, Exact); err != nil {
		t.Fatalf("Check(mark): %v", err)
	}
	wantStale(t, f.Check(t1, Exact), t2)
	wantStale(t, f.Check(t1, Monotonic), t2)
	if err := f.Check(t3, Exact); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("Exact check above the mark: %v", err)
	}

	// Same epoch, different owner or incarnation: ordered, not equal.
	sameEpoch := memTok(1, 2, "a")
	wantStale(t, f.Check(sameEpoch, Monotonic), t2)
	newer := t2
	newer.Incarnation++
	if err := f.Check(newer, Exact); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("higher incarnation, Exact: %v", err)
	}

	// Monotonic: a higher token advances the mark as a fence would.
	if err := f.Check(t3, Monotonic); err != nil {
		t.Fatalf("Monotonic check above the mark: %v", err)
	}
	if f.Current(1) != t3 {
		t.Fatalf("mark %v after a Monotonic advance, want %v", f.Current(1), t3)
	}
	wantStale(t, f.Check(t2, Exact), t3)

	// Partitions are independent.
	for _, p := range []uint32{0, 2, 3} {
		if !f.Current(p).IsZero() {
			t.Fatalf("partition %d moved: %v", p, f.Current(p))
		}
	}
}

func TestMemoryFenceDo(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	f, _ := NewMemoryFence(2)
	t1, t2 := memTok(0, 1, "a"), memTok(0, 2, "b")
	if _, err := f.Fence(ctx, t1); err != nil {
		t.Fatal(err)
	}
	ran := 0
	write := func() error { ran++; return nil }
	if err := f.Do(ctx, t1, Exact, write); err != nil || ran != 1 {
		t.Fatalf("Do(current) = %v, ran %d", err, ran)
	}
	boom := errors.New("boom")
	if err := f.Do(ctx, t1, Exact, func() error { return boom }); err != boom {
		t.Fatalf("Do did not return fn's error: %v", err)
	}
	if err := f.Do(ctx, t2, Exact, write); !errors.Is(err, ErrNotFenced) || ran != 1 {
		t.Fatalf("Do(unfenced, Exact) = %v, ran %d", err, ran)
	}
	if err := f.Do(ctx, t2, Monotonic, write); err != nil || ran != 2 || f.Current(0) != t2 {
		t.Fatalf("Do(higher, Monotonic) = %v, ran %d, mark %v", err, ran, f.Current(0))
	}
	for _, m := range []Mode{Exact, Monotonic} {
		err := f.Do(ctx, t1, m, write)
		wantStale(t, err, t2)
		if ran != 2 {
			t.Fatalf("stale Do ran fn")
		}
	}
	if err := f.Do(ctx, t2, Mode(9), write); err == nil || ran != 2 {
		t.Fatalf("unknown mode: %v", err)
	}
	if err := f.Do(ctx, t2, Exact, nil); err == nil {
		t.Fatal("nil fn accepted")
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Do(done, t2, Exact, write); !errors.Is(err, context.Canceled) || ran != 2 {
		t.Fatalf("Do with a done context = %v", err)
	}
	if _, err := f.Fence(done, memTok(0, 5, "x")); !errors.Is(err, context.Canceled) || f.Current(0) != t2 {
		t.Fatalf("Fence with a done context = %v", err)
	}
}

func TestMemoryFenceBadInput(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	for _, n := range []int{0, -1} {
		if _, err := NewMemoryFence(n); err == nil {
			t.Errorf("NewMemoryFence(%d) accepted", n)
		}
	}
	f, _ := NewMemoryFence(3)
	out := memTok(3, 1, "a")
	if err := f.Check(out, Monotonic); !errors.Is(err, ErrPartitionRange) {
		t.Errorf("Check: %v", err)
	}
	if _, err := f.Fence(ctx, out); !errors.Is(err, ErrPartitionRange) {
		t.Errorf("Fence: %v", err)
	}
	if err := f.Do(ctx, out, Exact, func() error { return nil }); !errors.Is(err, ErrPartitionRange) {
		t.Errorf("Do: %v", err)
	}
	if got := f.Current(3); !got.IsZero() {
		t.Errorf("Current out of range = %v", got)
	}
	if err := f.Check(memTok(0, 1, "a"), Mode(7)); err == nil {
		t.Error("unknown mode accepted")
	}
	if f.Partitions() != 3 {
		t.Errorf("Partitions = %d", f.Partitions())
	}
}

func TestMemoryFenceKeyring(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	k, _ := NewKeyring(macTestKey(1))
	other, _ := NewKeyring(macTestKey(2))
	f, err := NewMemoryFenceConfig(MemoryFenceConfig{Partitions: 1, Keyring: k})
	if err != nil {
		t.Fatal(err)
	}
	good := k.Sign(memTok(0, 1, "a"))
	if _, err := f.Fence(ctx, good); err != nil {
		t.Fatal(err)
	}
	// A forged huge epoch must not fence anyone out.
	forged := other.Sign(memTok(0, 1<<60, "evil"))
	if _, err := f.Fence(ctx, forged); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("Fence(forged) = %v", err)
	}
	if err := f.Check(forged, Monotonic); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("Check(forged) = %v", err)
	}
	if err := f.Do(ctx, forged, Monotonic, func() error { return nil }); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("Do(forged) = %v", err)
	}
	unsigned := good
	unsigned.MAC = [MACSize]byte{}
	if err := f.Check(unsigned, Exact); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("Check(unsigned mark) = %v", err)
	}
	flipped := good
	flipped.MAC[0] ^= 1
	if err := f.Check(flipped, Exact); !errors.Is(err, ErrBadMAC) {
		t.Fatalf("Check(mark with a flipped MAC bit) = %v", err)
	}
	if f.Current(0) != good {
		t.Fatalf("mark moved to %v", f.Current(0))
	}
	if err := f.Check(good, Exact); err != nil {
		t.Fatalf("Check(good) = %v", err)
	}
	if err := f.Do(ctx, good, Exact, func() error { return nil }); err != nil {
		t.Fatalf("Do(good) = %v", err)
	}
	// A token signed by an older key of the ring is accepted.
	rotated, _ := NewKeyring(macTestKey(3), macTestKey(1))
	f2, _ := NewMemoryFenceConfig(MemoryFenceConfig{Partitions: 1, Keyring: rotated})
	if err := f2.Check(good, Monotonic); err != nil {
		t.Fatalf("token signed by an older key: %v", err)
	}
}

// Fence waits for a Do in flight, and Check does not.
func TestMemoryFenceFenceWaitsForDo(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	f, _ := NewMemoryFence(1)
	t1, t2 := memTok(0, 1, "a"), memTok(0, 2, "b")
	if _, err := f.Fence(ctx, t1); err != nil {
		t.Fatal(err)
	}
	var fnDone atomic.Bool
	fenced := make(chan error, 1)
	err := f.Do(ctx, t1, Exact, func() error {
		go func() {
			_, err := f.Fence(ctx, t2)
			if err == nil && !fnDone.Load() {
				err = errors.New("Fence returned while a Do under the old token was running")
			}
			fenced <- err
		}()
		// Wait until the Fence is queued on the partition: a pending writer
		// makes TryRLock fail.
		p := &f.parts[0]
		for p.mu.TryRLock() {
			p.mu.RUnlock()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			runtime.Gosched()
		}
		if err := f.Check(t1, Exact); err != nil {
			return fmt.Errorf("Check blocked or failed while a Fence waited: %v", err)
		}
		fnDone.Store(true)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-fenced:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("Fence never returned")
	}
	wantStale(t, f.Check(t1, Exact), t2)
}

// Many writers with interleaved old and new tokens while the mark advances:
// no write under a token runs after a higher token was fenced, and every
// write under the current token runs.
func TestMemoryFenceConcurrentExact(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	const (
		partitions = 2
		epochs     = 30
		writers    = 6
		opsEach    = 1000
		maxOps     = 1_000_000
	)
	f, _ := NewMemoryFence(partitions)
	tokens := make([][]Token, partitions) // tokens[p][i] has epoch i+1
	for p := range tokens {
		for i := range epochs {
			tokens[p] = append(tokens[p], memTok(uint32(p), uint64(i+1), fmt.Sprintf("n%d", i%3)))
		}
	}

	type state struct {
		mu        sync.Mutex
		writes    []int // writes per epoch index
		readStale []int // at fence i, writes seen under epochs below i
		published atomic.Int64
		stale     atomic.Int64 // stale rejections
	}
	states := make([]*state, partitions)
	for p := range states {
		states[p] = &state{writes: make([]int, epochs), readStale: make([]int, epochs)}
		states[p].published.Store(-1)
	}

	var wg sync.WaitGroup
	errs := make(chan error, writers*partitions+partitions)
	for p := range partitions {
		st := states[p]
		count := func(i int) int {
			st.mu.Lock()
			defer st.mu.Unlock()
			return st.writes[i]
		}
		// The new owners, one after another: fence, then read.
		wg.Go(func() {
			for i, tok := range tokens[p] {
				if _, err := f.Fence(ctx, tok); err != nil {
					errs <- fmt.Errorf("fence %v: %v", tok, err)
					return
				}
				st.mu.Lock()
				for j := range i {
					st.readStale[i] += st.writes[j]
				}
				st.mu.Unlock()
				st.published.Store(int64(i))
				// Let the writers in under this token before moving on.
				for i < epochs-1 && count(i) < 5 {
					if ctx.Err() != nil {
						errs <- ctx.Err()
						return
					}
					runtime.Gosched()
				}
			}
		})
		for w := range writers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(p), uint64(w)))
				// At least opsEach operations, and on until the last fence.
				for n := 0; n < maxOps; n++ {
					pub := int(st.published.Load())
					if n >= opsEach && pub == epochs-1 {
						return
					}
					if ctx.Err() != nil {
						errs <- ctx.Err()
						return
					}
					if pub < 0 {
						runtime.Gosched()
						continue
					}
					i := pub
					if rng.IntN(3) == 0 {
						i = rng.IntN(pub + 1) // an old owner, maybe
					}
					tok := tokens[p][i]
					err := f.Do(ctx, tok, Exact, func() error {
						if cur := f.Current(uint32(p)); cur != tok {
							return fmt.Errorf("write under %v ran with mark %v", tok, cur)
						}
						st.mu.Lock()
						st.writes[i]++
						st.mu.Unlock()
						return nil
					})
					var se *StaleTokenError
					switch {
					case err == nil:
					case errors.As(err, &se):
						st.stale.Add(1)
						if se.Current.Compare(tok) <= 0 || f.Current(uint32(p)).Compare(tok) <= 0 {
							errs <- fmt.Errorf("write under %v rejected as stale, mark %v", tok, se.Current)
							return
						}
					default:
						errs <- err
						return
					}
					runtime.Gosched() // let the fencer run
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for p, st := range states {
		// Every write under the final, current token runs.
		last := tokens[p][epochs-1]
		for range 100 {
			if err := f.Do(ctx, last, Exact, func() error { return nil }); err != nil {
				t.Fatalf("write under the current token %v: %v", last, err)
			}
		}
		// S2: what each new owner read after fencing is final.
		for i := range epochs {
			total := 0
			for j := range i {
				total += st.writes[j]
			}
			if total != st.readStale[i] {
				t.Fatalf("partition %d: %d writes under epochs below %d after it fenced; it read %d",
					p, total, i+1, st.readStale[i])
			}
		}
		for i, n := range st.writes[:epochs-1] {
			if n < 5 {
				t.Fatalf("partition %d: %d writes under epoch %d", p, n, i+1)
			}
		}
		if st.stale.Load() == 0 {
			t.Fatalf("partition %d: no write was rejected as stale", p)
		}
		t.Logf("partition %d: writes per epoch %v, %d stale rejections", p, st.writes, st.stale.Load())
	}
}

// Monotonic writers with random tokens, some never fenced: the writes that
// run are in token order.
func TestMemoryFenceConcurrentMonotonic(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	const (
		epochs  = 200
		writers = 8
		opsEach = 2000
	)
	f, _ := NewMemoryFence(1)
	var mu sync.Mutex
	var applied []Token
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(7, uint64(w)))
			for n := range opsEach {
				// Tokens drift upwards with some stragglers.
				e := uint64(n*epochs/opsEach) + 1
				if rng.IntN(4) == 0 && e > 3 {
					e -= uint64(rng.IntN(3))
				}
				tok := memTok(0, e, fmt.Sprintf("n%d", rng.IntN(2)))
				if rng.IntN(2) == 0 {
					err := f.Check(tok, Monotonic)
					if err != nil && !errors.Is(err, ErrStaleToken) {
						errs <- err
						return
					}
					continue
				}
				err := f.Do(ctx, tok, Monotonic, func() error {
					mu.Lock()
					applied = append(applied, tok)
					mu.Unlock()
					return nil
				})
				var se *StaleTokenError
				if err != nil && (!errors.As(err, &se) || se.Current.Compare(tok) <= 0) {
					errs <- fmt.Errorf("write under %v: %v", tok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(applied) == 0 {
		t.Fatal("no write ran")
	}
	for i := 1; i < len(applied); i++ {
		if applied[i].Compare(applied[i-1]) < 0 {
			t.Fatalf("write %d under %v ran after a write under %v", i, applied[i], applied[i-1])
		}
	}
}

// Check racing Fence: once a Fence of a higher token has returned, Check
// rejects the older token.
func TestMemoryFenceConcurrentCheck(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	const epochs = 300
	f, _ := NewMemoryFence(1)
	var published atomic.Uint64 // highest epoch whose Fence returned
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Go(func() {
		for e := uint64(1); e <= epochs; e++ {
			if _, err := f.Fence(ctx, memTok(0, e, "n")); err != nil {
				errs <- err
				return
			}
			published.Store(e)
			runtime.Gosched()
		}
	})
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(9, uint64(w)))
			for published.Load() < epochs {
				before := published.Load()
				if before == 0 {
					runtime.Gosched()
					continue
				}
				e := before + 1 - uint64(rng.IntN(2))
				err := f.Check(memTok(0, e, "n"), Exact)
				if err == nil && e < before {
					errs <- fmt.Errorf("Check accepted epoch %d after epoch %d was fenced", e, before)
					return
				}
				var se *StaleTokenError
				if err != nil && e <= before && (!errors.As(err, &se) || se.Current.Epoch <= e) {
					errs <- fmt.Errorf("Check rejected fenced epoch %d, not for a higher one: %v", e, err)
					return
				}
				if ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// benchFence returns a fence of 64 partitions that verifies tokens under
// keys (if not nil), and a token signed by keys that it has fenced.
func benchFence(b *testing.B, keys *Keyring) (*MemoryFence, Token) {
	b.Helper()
	f, err := NewMemoryFenceConfig(MemoryFenceConfig{Partitions: 64, Keyring: keys})
	if err != nil {
		b.Fatal(err)
	}
	tok := keys.Sign(memTok(17, 5, "node-7.example"))
	if _, err := f.Fence(context.Background(), tok); err != nil {
		b.Fatal(err)
	}
	return f, tok
}

func BenchmarkMemoryFenceCheck(b *testing.B) {
	f, tok := benchFence(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.Check(tok, Exact); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryFenceCheckParallel(b *testing.B) {
	f, tok := benchFence(b, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f.Check(tok, Exact); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkMemoryFenceCheckKeyring(b *testing.B) {
	k, _ := NewKeyring(macTestKey(1))
	f, tok := benchFence(b, k)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.Check(tok, Exact); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryFenceDo(b *testing.B) {
	ctx := context.Background()
	f, tok := benchFence(b, nil)
	fn := func() error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := f.Do(ctx, tok, Exact, fn); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryFenceDoParallel(b *testing.B) {
	ctx := context.Background()
	f, tok := benchFence(b, nil)
	fn := func() error { return nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f.Do(ctx, tok, Exact, fn); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
