package ring

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestHolderZeroValueAndSwaps(t *testing.T) {
	var h Holder
	if h.Load() != nil {
		t.Fatal("zero Holder holds a Table")
	}
	if p, o := h.Load().Lookup([]byte("k")); p != 0 || o != "" {
		t.Fatalf("lookup through an empty Holder = %d %q", p, o)
	}
	a, _ := New([]string{"a"}, DefaultConfig())
	b, _ := New([]string{"b"}, DefaultConfig())
	h.Store(a)
	if h.Load() != a {
		t.Fatal("Load after Store")
	}
	if old := h.Swap(b); old != a || h.Load() != b {
		t.Fatal("Swap")
	}
	if h.CompareAndSwap(a, a) || h.Load() != b {
		t.Fatal("CompareAndSwap with a stale old value swapped")
	}
	if !h.CompareAndSwap(b, a) || h.Load() != a {
		t.Fatal("CompareAndSwap with the current value did not swap")
	}
}

// TestHolderConcurrentReaders runs readers against a Holder whose Table is
// swapped underneath them; run with -race. Each lookup must be consistent
// with the one Table the reader loaded.
func TestHolderConcurrentReaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var tables []*Table
	for n := 3; n <= 6; n++ {
		members := make([]string, n)
		for i := range members {
			members[i] = fmt.Sprintf("node-%d", i)
		}
		tab, err := New(members, DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tab)
	}
	var h Holder
	h.Store(tables[0])
	const readers, reads, writes = 4, 20000, 2000
	errs := make(chan error, readers)
	var wg sync.WaitGroup
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < reads && ctx.Err() == nil; i++ {
				tab := h.Load()
				key := fmt.Appendf(nil, "%d/%d", r, i)
				p, o := tab.Lookup(key)
				if p != tab.Partition(key) || o != tab.Owner(p) || !tab.Has(o) {
					errs <- fmt.Errorf("Lookup(%q) = %d %q, inconsistent with its table", key, p, o)
					return
				}
			}
		}()
	}
	for i := 0; i < writes && ctx.Err() == nil; i++ {
		h.Store(tables[i%len(tables)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ctx.Err() != nil {
		t.Fatal("test ran out of time")
	}
}
