package routing

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// frozen serves at addr a handler that, once entered, never answers until
// the test ends: an owner stopped (SIGSTOP) with the request in hand.
func frozen(t *testing.T, n *bufNet, addr string) (entered *atomic.Int64) {
	entered = new(atomic.Int64)
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	n.serveFunc(addr, pointing(t, func() string { return "self" }), func(ctx context.Context) error {
		entered.Add(1)
		select {
		case <-stuck:
		case <-ctx.Done():
		}
		return status.Error(codes.Unavailable, "frozen")
	})
	return entered
}

// A call in flight at an owner that leaves the membership is cancelled as
// soon as the router hears of it, and never waits for its deadline: it is
// retried at the new owner when that is safe (a request id, an idempotent
// method), and ends with an unknown outcome otherwise. The departed
// member's connection is closed.
func TestRouterFollowsMembership(t *testing.T) {
	for _, c := range []struct {
		name        string
		id          bool
		idempotent  bool
		wantUnknown bool
	}{
		{"plain write", false, false, true},
		{"request id", true, false, false},
		{"idempotent", false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newBufNet(t)
			entered := frozen(t, n, "old")
			next := n.guarded("new", pointing(t, func() string { return "self" }))
			owners := &fakeOwners{addr: "old"}
			owners.setMembers("old", "new")
			r := n.router(owners, func(cfg *RouterConfig) {
				cfg.Idempotent = func(string) bool { return c.idempotent }
			})
			ctx := testkit.Ctx(t, 30*time.Second)
			if c.id {
				var err error
				if ctx, err = transport.WithRequestID(ctx, transport.NewRequestID()); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() {
				_, err := put(ctx, r, "k")
				done <- err
			}()
			tenuretest.WaitFor(ctx, t, "the call to reach the old owner", func() bool { return entered.Load() == 1 })
			if _, ok := (*r.conns.Load())["old"]; !ok {
				t.Fatal("no connection to the old owner")
			}
			owners.claim("n-new", "new")
			owners.setMembers("new") // "old" failed
			err := <-done
			if ctx.Err() != nil {
				t.Fatalf("the call waited for its deadline: %v", err)
			}
			if got := transport.IsOutcomeUnknown(err); got != c.wantUnknown || (!c.wantUnknown && err != nil) {
				t.Fatalf("call = %v; want an unknown outcome: %v", err, c.wantUnknown)
			}
			if c.wantUnknown && (errors.Is(err, context.Canceled) || status.Code(err) != codes.Unknown) {
				t.Fatalf("unknown outcome %v: code %v", err, status.Code(err))
			}
			if calls := next.calls.Load(); (calls == 1) == c.wantUnknown {
				t.Fatalf("calls at the new owner: %d", calls)
			}
			if st := r.Stats(); st.Cancelled != 1 || (st.Unknown == 1) != c.wantUnknown {
				t.Fatalf("stats %+v", st)
			}
			tenuretest.WaitFor(ctx, t, "the departed member's connection to close", func() bool {
				_, ok := (*r.conns.Load())["old"]
				return !ok
			})
		})
	}
}

// An owner that stays a member but whose partition another node has
// claimed loses the attempts still in flight at it after MoveGrace.
func TestRouterFollowsClaims(t *testing.T) {
	n := newBufNet(t)
	entered := frozen(t, n, "old")
	n.guarded("new", pointing(t, func() string { return "self" }))
	owners := &fakeOwners{addr: "old"}
	owners.setMembers("old", "new")
	r := n.router(owners, func(cfg *RouterConfig) { cfg.MoveGrace = 50 * time.Millisecond })
	ctx, err := transport.WithRequestID(testkit.Ctx(t, 30*time.Second), "req-1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		got, err := put(ctx, r, "k")
		if err == nil && got != "new" {
			err = fmt.Errorf("served by %s", got)
		}
		done <- err
	}()
	tenuretest.WaitFor(ctx, t, "the call to reach the old owner", func() bool { return entered.Load() == 1 })
	owners.claim("n-new", "new")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Cancelled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// An owner's answer that the outcome is unknown is passed on, and never
// retried unless the call carries a request id.
func TestRouterOutcomeUnknownAnswer(t *testing.T) {
	n := newBufNet(t)
	var calls atomic.Int64
	n.serveFunc("a", pointing(t, func() string { return "self" }), func(context.Context) error {
		calls.Add(1)
		return fmt.Errorf("commit: %w", ownership.ErrOutcomeUnknown)
	})
	owners := &fakeOwners{addr: "a"}
	owners.setMembers("a")
	r := n.router(owners, func(cfg *RouterConfig) { cfg.MaxAttempts = 2 })
	ctx := testkit.Ctx(t, 10*time.Second)
	_, err := put(ctx, r, "k")
	ou, ok := transport.AsOutcomeUnknown(err)
	if !ok || !errors.Is(err, ownership.ErrOutcomeUnknown) || ou.Addr != "a" || calls.Load() != 1 {
		t.Fatalf("put = %v (%+v), %d calls; want one call and an unknown outcome at a", err, ou, calls.Load())
	}
	// With an id, the call is retried (the owner would answer a duplicate
	// with the first outcome), up to MaxAttempts.
	idctx, err := transport.WithRequestID(ctx, "req-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := put(idctx, r, "k"); !transport.IsOutcomeUnknown(err) || calls.Load() != 1+3 {
		t.Fatalf("put with an id = %v after %d calls; want an unknown outcome after 3 more", err, calls.Load())
	}
}

// A call whose deadline passes while it is in flight may have been
// applied: an unknown outcome, unless the method is idempotent (then it is
// the deadline, as before).
func TestRouterDeadlineInFlight(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		t.Run(fmt.Sprint("idempotent ", idempotent), func(t *testing.T) {
			n := newBufNet(t)
			frozen(t, n, "a")
			owners := &fakeOwners{addr: "a"}
			owners.setMembers("a")
			r := n.router(owners, func(cfg *RouterConfig) { cfg.Idempotent = func(string) bool { return idempotent } })
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := put(ctx, r, "k")
			if idempotent {
				if status.Code(err) != codes.DeadlineExceeded || transport.IsOutcomeUnknown(err) {
					t.Fatalf("idempotent call = %v, want DeadlineExceeded", err)
				}
				return
			}
			if !transport.IsOutcomeUnknown(err) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("write = %v, want an unknown outcome without a context error", err)
			}
		})
	}
}

// A request id that can't be sent is refused before any attempt.
func TestRouterBadRequestID(t *testing.T) {
	n := newBufNet(t)
	owners := &fakeOwners{addr: "a"}
	r := n.router(owners, nil)
	if _, err := transport.WithRequestID(context.Background(), "has space"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("WithRequestID with a space: %v", err)
	}
	ctx, _ := transport.WithRequestID(testkit.Ctx(t, 10*time.Second), "one")
	ctx = withRawRequestID(ctx, "two")
	if _, err := put(ctx, r, "k"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("two request ids: %v", err)
	}
}

// A call pausing for a handoff is woken as soon as the follower hears the
// partition claimed, not when its backoff ends; with a Membership that
// gives no events, by the follower's check every FollowInterval.
func TestRouterWakesOnClaim(t *testing.T) {
	for _, events := range []bool{true, false} {
		t.Run(fmt.Sprint("events ", events), func(t *testing.T) {
			n := newBufNet(t)
			var claimed atomic.Bool
			n.guarded("a", pointing(t, func() string {
				if claimed.Load() {
					return "self"
				}
				return "" // a handoff: the ring says a, which holds no lease yet
			}))
			owners := &fakeOwners{addr: "a", noEvents: !events}
			owners.setMembers("a")
			// Pauses of 10 to 20 s: only a wake-up lets the call finish in time.
			r := n.router(owners, func(cfg *RouterConfig) { cfg.BackoffBase, cfg.BackoffMax = 20*time.Second, 20*time.Second })
			ctx := testkit.Ctx(t, 5*time.Second)
			done := make(chan error, 1)
			go func() { _, err := put(ctx, r, "k"); done <- err }()
			tenuretest.WaitFor(ctx, t, "the call to pause", func() bool { return r.Stats().Retries == 1 })
			claimed.Store(true)
			owners.claim("n-a", "a")
			if err := <-done; err != nil {
				t.Fatalf("put = %v; want it woken by the claim", err)
			}
		})
	}
}

// With events, the follower reads nothing while nothing happens: a call
// in flight and a call pausing cost no periodic Owners lookups.
func TestRouterFollowsWithoutPolling(t *testing.T) {
	n := newBufNet(t)
	frozen(t, n, "a")
	n.guarded("b", pointing(t, func() string { return "" })) // always a handoff
	owners := &fakeOwners{addr: "a"}
	owners.setMembers("a", "b")
	r := n.router(owners, func(cfg *RouterConfig) {
		cfg.BackoffBase, cfg.BackoffMax = 20*time.Second, 20*time.Second
		cfg.FollowInterval = 10 * time.Millisecond // would be polled 50 times below
	})
	ctx, cancel := context.WithCancel(testkit.Ctx(t, 10*time.Second))
	inFlight := make(chan error, 1)
	go func() { _, err := put(ctx, r, "k"); inFlight <- err }() // stays at a
	tenuretest.WaitFor(ctx, t, "the call to be in flight", func() bool { return len(r.inflightSnapshot()) == 1 })
	owners.set("b")
	paused := make(chan error, 1)
	go func() { _, err := put(ctx, r, "j"); paused <- err }() // pauses for b's handoff
	tenuretest.WaitFor(ctx, t, "the second call to pause", func() bool { return r.Stats().Retries == 1 })
	before := owners.owners.Load()
	window := time.NewTimer(500 * time.Millisecond)
	select {
	case <-window.C:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if got := owners.owners.Load() - before; got != 0 {
		t.Errorf("%d Owners lookups in 500 ms with nothing happening; want 0", got)
	}
	cancel()
	<-inFlight
	<-paused
}

// An attempt whose target was chosen from a view older than the
// follower's last check is checked as the follower would have: one at a
// member that has left is cancelled before it is sent, and that member's
// address is refused until a member serves there again. A subscription
// that was full when read is taken as events dropped: the follower checks
// every call.
func TestRouterRechecksLateAttempts(t *testing.T) {
	n := newBufNet(t)
	owners := &fakeOwners{addr: "old", room: 1}
	owners.setMembers("old", "new")
	r := n.router(owners, nil)
	ctx := testkit.Ctx(t, 10*time.Second)
	rt := &route{r: r, key: []byte("k")}
	addr, node, err := rt.target()
	if err != nil || addr != "old" {
		t.Fatalf("target = %s, %v", addr, err)
	}
	gen := r.gen.Load()
	owners.setMembers("new")
	tenuretest.WaitFor(ctx, t, "the follower to check", func() bool { return r.gen.Load() != gen })
	a := r.begin(ctx, rt, addr, node, nil)
	defer r.end(a)
	var gone *ownerGoneError
	if !errors.As(context.Cause(a.ctx), &gone) {
		t.Fatalf("late attempt at a departed member: cause %v, want it cancelled", context.Cause(a.ctx))
	}
	if _, err := r.Conn("old"); status.Code(err) != codes.Unavailable {
		t.Fatalf("Conn to a departed member's address = %v, want Unavailable", err)
	}
	owners.setMembers("old", "new")
	tenuretest.WaitFor(ctx, t, "the address to serve again", func() bool { _, err := r.Conn("old"); return err == nil })

	// Members change without an event of their own; the next event (of no
	// interest) finds the one-slot channel full: everything is checked.
	b := r.begin(ctx, &route{r: r, key: []byte("k"), gen: r.gen.Load()}, "old", "n-old", nil)
	defer r.end(b)
	owners.mu.Lock()
	owners.members = owners.members[1:] // "old" left, unannounced
	owners.mu.Unlock()
	owners.event(coordinator.Event{Kind: coordinator.EventLeaseEnded})
	tenuretest.WaitFor(ctx, t, "the attempt at old to be cancelled", func() bool { return b.ctx.Err() != nil })
}

// inflightSnapshot returns the attempts registered with the follower.
func (r *Router) inflightSnapshot() []*attempt {
	r.inflightMu.Lock()
	defer r.inflightMu.Unlock()
	var out []*attempt
	for a := range r.inflight {
		out = append(out, a)
	}
	return out
}
