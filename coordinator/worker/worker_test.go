package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// newRuntime returns a Runtime for cfg on a Fake, both closed when the
// test ends.
func newRuntime(t *testing.T, cfg worker.Config) (*worker.Runtime, *tenuretest.Fake) {
	t.Helper()
	rt, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := tenuretest.NewFake(tenuretest.FakeConfig{Handler: rt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fake.Close(ctx)
		rt.Close()
	})
	return rt, fake
}

// stops records the Stop hook's calls.
type stops struct {
	mu   sync.Mutex
	errs map[uint32][]error
}

func (s *stops) stop(l *ownership.Lease, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errs == nil {
		s.errs = map[uint32][]error{}
	}
	s.errs[l.Partition()] = append(s.errs[l.Partition()], err)
}

func (s *stops) of(p uint32) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs[p]...)
}

// A planned release lets the batch in hand finish with its context live,
// and Release waits for it; Stop is told nil.
func TestReleaseDrainsTheBatchInHand(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	var openGate sync.Once
	var calls, cancelled atomic.Int32
	var st stops
	_, fake := newRuntime(t, worker.Config{
		Stop: st.stop,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			calls.Add(1)
			entered <- struct{}{}
			<-gate
			if ctx.Err() != nil {
				cancelled.Add(1)
			}
			return 1, nil
		},
	})
	t.Cleanup(func() { openGate.Do(func() { close(gate) }) }) // before the runtime's Close
	if _, err := fake.Grant(ctx, 3); err != nil {
		t.Fatal(err)
	}
	<-entered
	moved := make(chan error, 1)
	go func() { moved <- fake.Move(ctx, 3) }()
	// Release must wait for the batch: give Move every chance to return
	// early, then check it did not.
	tenuretest.WaitFor(ctx, t, "the lease to leave the fake", func() bool { return fake.Lease(3) == nil })
	select {
	case err := <-moved:
		t.Fatalf("Move returned (%v) while the batch in hand was running", err)
	default:
	}
	openGate.Do(func() { close(gate) })
	if err := <-moved; err != nil {
		t.Fatalf("Move: %v", err)
	}
	if n := cancelled.Load(); n != 0 {
		t.Errorf("the drained batch's context was cancelled")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Process called %d times, want 1 (no batch after the drain)", n)
	}
	if errs := st.of(3); len(errs) != 1 || errs[0] != nil {
		t.Errorf("Stop got %v, want one nil", errs)
	}
}

// A lost lease cancels the batch in hand; Stop is told the lease's cause.
func TestLostLeaseCancelsTheBatch(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	entered := make(chan struct{}, 1)
	var st stops
	rt, fake := newRuntime(t, worker.Config{
		Stop: st.stop,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			entered <- struct{}{}
			<-ctx.Done()
			return 0, ctx.Err()
		},
	})
	if _, err := fake.Grant(ctx, 5); err != nil {
		t.Fatal(err)
	}
	<-entered
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := fake.Revoke(rctx, 5, errors.New("step-down")); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if errs := st.of(5); len(errs) != 1 || !errors.Is(errs[0], ownership.ErrLeaseEnded) {
		t.Errorf("Stop got %v, want the lease's end", errs)
	}
	if s := rt.Stats(); s.Running != 0 || s.Errors != 0 {
		t.Errorf("stats after a lost lease: %+v", s)
	}
}

// reporter records ReportStale's calls.
type reporter struct {
	mu   sync.Mutex
	errs []error
}

func (r *reporter) ReportStale(err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
	return true
}

func (r *reporter) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs)
}

// A commit the fence refused is reported to the coordinator once, and the
// worker stops without another batch.
func TestStaleCommitReportedAndStops(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	var calls atomic.Int32
	var st stops
	var rep reporter
	rt, fake := newRuntime(t, worker.Config{
		Stop: st.stop,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			calls.Add(1)
			return 0, fmt.Errorf("commit: %w", &ownership.StaleTokenError{Token: l.Token()})
		},
	})
	rt.Bind(&rep)
	if _, err := fake.Grant(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tenuretest.WaitFor(ctx, t, "the worker to stop", func() bool { return len(st.of(1)) == 1 })
	if rep.count() != 1 {
		t.Fatalf("ReportStale called %d times, want 1", rep.count())
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Process called %d times after a stale commit, want 1", n)
	}
	if errs := st.of(1); !errors.Is(errs[0], ownership.ErrStaleToken) {
		t.Errorf("Stop got %v, want the stale token error", errs[0])
	}
	if s := rt.Stats(); s.Stale != 1 || s.Running != 0 {
		t.Errorf("stats: %+v, want 1 stale and none running", s)
	}
	// Unbound, the runtime ends the lease itself.
	rt2, fake2 := newRuntime(t, worker.Config{Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
		return 0, &ownership.StaleTokenError{Token: l.Token()}
	}})
	l, err := fake2.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	tenuretest.WaitFor(wctx, t, "the unbound runtime to end the lease", func() bool { return l.Err() != nil })
	if !errors.Is(l.Err(), ownership.ErrStaleToken) || !errors.Is(l.Err(), ownership.ErrLeaseEnded) {
		t.Errorf("lease ended with %v, want the stale token error", l.Err())
	}
	_ = rt2
}

// manualClock fires a ticker only when the test says so, and records the
// intervals asked for.
type manualClock struct {
	mu      sync.Mutex
	asked   []time.Duration
	tickers []chan time.Time
}

func (c *manualClock) Now() time.Time { return time.Now() }

func (c *manualClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, d)
	c.tickers = append(c.tickers, ch)
	return ch, func() {}
}

// fire ticks the latest ticker.
func (c *manualClock) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickers[len(c.tickers)-1] <- time.Now()
}

func (c *manualClock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.asked...)
}

// An idle partition backs off on the clock: PollInterval doubling up to
// MaxPollInterval, and no call before the clock says so; a batch of
// events resets the back-off.
func TestIdleBackoff(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	clock := &manualClock{}
	var calls atomic.Int32
	events := make(chan int, 1)
	_, fake := newRuntime(t, worker.Config{
		Clock:           clock,
		PollInterval:    10 * time.Millisecond,
		MaxPollInterval: 50 * time.Millisecond,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			calls.Add(1)
			select {
			case n := <-events:
				return n, nil
			default:
				return 0, nil
			}
		},
	})
	if _, err := fake.Grant(ctx, 0); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{10, 20, 40, 50, 50}
	for i := range want {
		want[i] *= time.Millisecond
		tenuretest.WaitFor(ctx, t, "a back-off", func() bool { return len(clock.waits()) == i+1 })
		if n := calls.Load(); n != int32(i+1) {
			t.Fatalf("%d calls while waiting for back-off %d: the worker did not wait for the clock", n, i+1)
		}
		if i == len(want)-1 {
			events <- 3 // the next call gets a batch
		}
		clock.fire()
	}
	// The first len(want): after the last fire the worker may already be
	// waiting again, after its batch (checked below); on a busy machine
	// that wait was once read here too and failed the test.
	if got := clock.waits(); len(got) < len(want) || fmt.Sprint(got[:len(want)]) != fmt.Sprint(want) {
		t.Errorf("back-offs %v, want %v first", got, want)
	}
	// After the batch, the next idle call waits PollInterval again.
	tenuretest.WaitFor(ctx, t, "the back-off after a batch", func() bool { return len(clock.waits()) == len(want)+1 })
	if got := clock.waits()[len(want)]; got != 10*time.Millisecond {
		t.Errorf("back-off after a batch = %v, want PollInterval", got)
	}
}

// MaxConcurrent bounds the batches in progress across partitions.
func TestMaxConcurrent(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	var inflight, peak, calls atomic.Int32
	gate := make(chan struct{})
	_, fake := newRuntime(t, worker.Config{
		MaxConcurrent: 2,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			n := inflight.Add(1)
			defer inflight.Add(-1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			calls.Add(1)
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return 1, nil
		},
	})
	for p := range uint32(6) {
		if _, err := fake.Grant(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	tenuretest.WaitFor(ctx, t, "two batches in progress", func() bool { return inflight.Load() >= 2 })
	close(gate)
	tenuretest.WaitFor(ctx, t, "many batches", func() bool { return calls.Load() >= 200 })
	if p := peak.Load(); p != 2 {
		t.Errorf("peak batches in progress %d, want 2", p)
	}
}

// Close cancels every worker and waits for them; Acquire after Close
// fails.
func TestCloseStopsWorkers(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	var st stops
	rt, err := worker.New(worker.Config{Stop: st.stop, Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(4) {
		if err := rt.Acquire(ctx, ownership.NewLease(ctx, ownership.Token{Partition: p, Epoch: 1, Owner: "n", Incarnation: 1})); err != nil {
			t.Fatal(err)
		}
	}
	rt.Close()
	if s := rt.Stats(); s.Running != 0 {
		t.Errorf("%d workers running after Close", s.Running)
	}
	for p := range uint32(4) {
		if errs := st.of(p); len(errs) != 1 || errs[0] == nil {
			t.Errorf("p%d: Stop got %v, want one error", p, errs)
		}
	}
	if err := rt.Acquire(ctx, ownership.NewLease(ctx, ownership.Token{Partition: 9, Epoch: 1, Owner: "n", Incarnation: 1})); err == nil {
		t.Error("Acquire after Close succeeded")
	}
	if _, err := worker.New(worker.Config{}); err == nil {
		t.Error("New without Process succeeded")
	}
}

// Binding nothing (a nil Reporter, or a nil *coordinator.Coordinator: a
// Bind called before coordinator.New assigned it) is the same as not
// binding: a stale commit ends the lease; it does not panic the worker's
// goroutine, which would crash the program.
func TestBindNilReporter(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	for i, rep := range []worker.Reporter{nil, (*coordinator.Coordinator)(nil)} {
		rt, fake := newRuntime(t, worker.Config{Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			return 0, &ownership.StaleTokenError{Token: l.Token()}
		}})
		rt.Bind(rep)
		l, err := fake.Grant(ctx, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		tenuretest.WaitFor(wctx, t, "the lease to end", func() bool { return l.Err() != nil })
		wcancel()
		if !errors.Is(l.Err(), ownership.ErrStaleToken) {
			t.Errorf("Bind(%#v): lease ended with %v, want the stale token error", rep, l.Err())
		}
	}
}

// A Process that panics is a failed batch, not a crash of the node: the
// worker logs it, counts it in Stats.Errors, backs off and calls again.
// (Before, the panic ended the program: a batch that panics on every
// node would have taken the cluster down one node at a time.)
func TestProcessPanicIsAFailedBatch(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	var calls atomic.Int32
	done := make(chan struct{})
	rt, fake := newRuntime(t, worker.Config{
		PollInterval: time.Millisecond,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) {
			switch calls.Add(1) {
			case 1:
				panic("a poison event")
			case 2:
				close(done)
				return 1, nil
			}
			return 0, nil
		},
	})
	if _, err := fake.Grant(ctx, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("no call after the panic")
	}
	tenuretest.WaitFor(ctx, t, "the batch after the panic counted", func() bool { return rt.Stats().Batches == 1 })
	if s := rt.Stats(); s.Errors != 1 || s.Running != 1 {
		t.Errorf("stats after a panic: %+v, want 1 error and the worker running", s)
	}
}

// A Runtime not made by New (its zero value) refuses Acquire with an
// error instead of panicking on the coordinator's goroutine; its other
// methods do nothing.
func TestZeroRuntime(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	var rt worker.Runtime
	fake, err := tenuretest.NewFake(tenuretest.FakeConfig{Handler: &rt})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close(ctx)
	if _, err := fake.Grant(ctx, 1); err == nil {
		t.Fatal("Acquire of a zero Runtime succeeded")
	}
	if err := rt.Close(); err != nil {
		t.Errorf("Close of a zero Runtime: %v", err)
	}
	if s := rt.Stats(); s != (worker.Stats{}) {
		t.Errorf("Stats of a zero Runtime: %+v", s)
	}
}

// Review of issue 23: Acquire ran Start before it checked for Close, so a
// Close while Start ran (or before Acquire) left a Start without its Stop.
// Now a Close during Start gets its Stop (coordinator.ErrClosed) and an
// Acquire after Close calls neither.
func TestNoStartWithoutStop(t *testing.T) {
	ctx := testkit.Ctx(t, 2*time.Minute)
	inStart, proceed := make(chan struct{}), make(chan struct{})
	var starts atomic.Int32
	var st stops
	rt, fake := newRuntime(t, worker.Config{
		Start: func(ctx context.Context, l *ownership.Lease) error {
			if starts.Add(1) == 1 {
				close(inStart)
				<-proceed
			}
			return nil
		},
		Stop:    st.stop,
		Process: func(ctx context.Context, l *ownership.Lease) (int, error) { return 0, nil },
	})
	granted := make(chan error, 1)
	go func() {
		_, err := fake.Grant(ctx, 1)
		granted <- err
	}()
	<-inStart
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := <-granted; !errors.Is(err, coordinator.ErrClosed) {
		t.Fatalf("Acquire that Close overtook: %v, want coordinator.ErrClosed", err)
	}
	if got := st.of(1); len(got) != 1 || !errors.Is(got[0], coordinator.ErrClosed) {
		t.Fatalf("Stop calls for the lease whose Start ran: %v, want one with ErrClosed", got)
	}
	if _, err := fake.Grant(ctx, 2); !errors.Is(err, coordinator.ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want coordinator.ErrClosed", err)
	}
	if n := starts.Load(); n != 1 {
		t.Fatalf("Start ran %d times, want 1 (none after Close)", n)
	}
}
