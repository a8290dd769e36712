package sqlfence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// stepClock stands still until the test advances it; its tickers tick
// only then.
type stepClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers []chan time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) NewTicker(time.Duration) (<-chan time.Time, func()) {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickers = append(c.tickers, ch)
	return ch, func() {}
}

// advance moves the clock by d and ticks every ticker made so far.
func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, ch := range c.tickers {
		select {
		case ch <- c.now:
		default:
		}
	}
}

// MaxWait runs on BatchConfig.Clock: with MaxWait an hour, a write that
// finds the partition busy (its last batch ended within MaxWait) waits
// until the clock says the hour has passed, not an hour of the system's.
// (Before Clock, the Batcher used time.Now and real timers, and the write
// below waited a real hour.)
func TestBatcherMaxWaitFollowsTheClock(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	clock := &stepClock{now: time.Unix(1e9, 0)}
	r := newBatchRig(t, backends()[0], sqlfence.BatchConfig{MaxWait: time.Hour, Clock: clock})
	tk := fencetest.Tok(1, 1, "a", 1)
	fenced(t, r.f, tk)
	if _, _, err := r.b.Do(ctx, tk, "", r.insert(1)); err != nil {
		t.Fatalf("a lone write: %v", err)
	}
	second := r.async(ctx, tk, "", r.insert(2))
	r.queued(t, 1, 1)
	clock.advance(time.Hour - time.Second)
	select {
	case o := <-second:
		t.Fatalf("a write went before the clock's MaxWait had passed: %v", o.err)
	default:
	}
	clock.advance(time.Second)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	select {
	case o := <-second:
		if o.err != nil {
			t.Fatal(o.err)
		}
	case <-wctx.Done():
		t.Fatal("the write did not go once the clock's MaxWait had passed")
	}
	if infos := r.infos(); len(infos) != 2 || infos[1].Wait != time.Hour {
		t.Fatalf("batches %+v; want two, the second waiting the clock's hour", infos)
	}
}
