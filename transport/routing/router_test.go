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
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// ownerAt returns a fakeLeases that serves when owner() names "self" and
// otherwise points at owner().
func pointing(t *testing.T, owner func() string) *fakeLeases {
	lease := liveLease(t)
	return &fakeLeases{lease: func([]byte) (*ownership.Lease, error) {
		switch o := owner(); o {
		case "self":
			return lease, nil
		case "":
			return nil, notOwner("self", "", 0) // handoff
		default:
			return nil, notOwner(o, o, 5)
		}
	}}
}

func TestRouterFollowsHint(t *testing.T) {
	n := newBufNet(t)
	a := n.guarded("a", pointing(t, func() string { return "b" }))
	b := n.guarded("b", pointing(t, func() string { return "self" }))
	r := n.router(ownedBy("a", "b"), nil)
	got, err := put(testkit.Ctx(t, 10*time.Second), r, "k")
	if err != nil || got != "b" {
		t.Fatalf("put = %q %v, want b", got, err)
	}
	if a.calls.Load() != 0 || b.calls.Load() != 1 {
		t.Fatalf("handler calls a=%d b=%d", a.calls.Load(), b.calls.Load())
	}
	if st := r.Stats(); st.Redirects != 1 || st.Retries != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRouterLoopGuard(t *testing.T) {
	n := newBufNet(t)
	n.guarded("a", pointing(t, func() string { return "b" }))
	n.guarded("b", pointing(t, func() string { return "a" }))
	r := n.router(ownedBy("a", "b"), func(c *RouterConfig) { c.MaxAttempts = 3 })
	_, err := put(testkit.Ctx(t, 10*time.Second), r, "k")
	if _, ok := transport.OwnerHint(err); !ok {
		t.Fatalf("want the last not-owner answer, got %v", err)
	}
	// Each row: a -> b, b points back at a (the guard), then a pause; four
	// rows (the first and three retries).
	if st := r.Stats(); st.Retries != 3 || st.Redirects != 8 {
		t.Fatalf("stats %+v, want 3 retries and 8 redirects", st)
	}
}

func TestRouterMaxRedirects(t *testing.T) {
	n := newBufNet(t)
	for _, hop := range [][2]string{{"a", "b"}, {"b", "c"}, {"c", "d"}, {"d", "e"}} {
		n.guarded(hop[0], pointing(t, func() string { return hop[1] }))
	}
	n.guarded("e", pointing(t, func() string { return "self" }))
	members := []string{"b", "c", "d", "e"}
	r := n.router(ownedBy("a", members...), func(c *RouterConfig) { c.MaxRedirects = 2; c.MaxAttempts = 1 })
	if _, err := put(testkit.Ctx(t, 10*time.Second), r, "k"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("want FailedPrecondition after too many redirects, got %v", err)
	}
	r = n.router(ownedBy("a", members...), func(c *RouterConfig) { c.MaxRedirects = 4 })
	if got, err := put(testkit.Ctx(t, 10*time.Second), r, "k"); err != nil || got != "e" {
		t.Fatalf("4 redirects allowed: %q %v", got, err)
	}
}

func TestRouterWaitsOutHandoff(t *testing.T) {
	n := newBufNet(t)
	var refusals atomic.Int64
	refusals.Store(3)
	s := n.guarded("a", pointing(t, func() string {
		if refusals.Add(-1) >= 0 {
			return ""
		}
		return "self"
	}))
	r := n.router(&fakeOwners{addr: "a"}, nil)
	got, err := put(testkit.Ctx(t, 10*time.Second), r, "k")
	if err != nil || got != "a" {
		t.Fatalf("put = %q %v", got, err)
	}
	if st := r.Stats(); st.Retries != 3 || s.calls.Load() != 1 {
		t.Fatalf("stats %+v, handler calls %d", st, s.calls.Load())
	}
}

// An owner that can't be reached is waited for, never replaced by a node
// that answers.
func TestRouterNeverMovesAKey(t *testing.T) {
	n := newBufNet(t)
	other := n.guarded("other", pointing(t, func() string { return "self" }))
	owners := &fakeOwners{addr: "dead"}
	r := n.router(owners, func(c *RouterConfig) { c.MaxAttempts = 1000 })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := put(ctx, r, "k")
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("want DeadlineExceeded while the owner is down, got %v", err)
	}
	if other.calls.Load() != 0 || r.Stats().Retries == 0 {
		t.Fatalf("calls elsewhere %d, retries %d", other.calls.Load(), r.Stats().Retries)
	}

	// With a bounded number of attempts, the error is Unavailable.
	r = n.router(owners, func(c *RouterConfig) { c.MaxAttempts = 2 })
	if _, err := put(testkit.Ctx(t, 10*time.Second), r, "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("want Unavailable, got %v", err)
	}

	// The owner comes back (the cluster re-owned the key, say): calls flow.
	r = n.router(owners, nil)
	done := make(chan error, 1)
	go func() {
		_, err := put(testkit.Ctx(t, 10*time.Second), r, "k")
		done <- err
	}()
	tenuretest.WaitFor(testkit.Ctx(t, 10*time.Second), t, "a retry", func() bool { return r.Stats().Retries > 0 })
	owners.set("other")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if other.calls.Load() != 1 {
		t.Fatalf("calls at the new owner: %d", other.calls.Load())
	}
}

func TestRouterNoOwner(t *testing.T) {
	n := newBufNet(t)
	r := n.router(&fakeOwners{err: errors.New("no members")}, func(c *RouterConfig) { c.MaxAttempts = 2 })
	if _, err := put(testkit.Ctx(t, 10*time.Second), r, "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("want Unavailable, got %v", err)
	}
	if r.Stats().Retries != 2 {
		t.Fatalf("retries %d", r.Stats().Retries)
	}
}

func TestRouterBadCalls(t *testing.T) {
	n := newBufNet(t)
	n.guarded("a", pointing(t, func() string { return "self" }))
	r := n.router(&fakeOwners{addr: "a"}, nil)
	ctx := testkit.Ctx(t, 10*time.Second)
	out := new(wrapperspb.StringValue)
	if err := r.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), out); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no key: %v", err)
	}
	if err := r.Invoke(transport.WithKey(ctx, nil), methodPut, wrapperspb.Bytes(nil), out); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty key: %v", err)
	}
	if err := r.Invoke(transport.WithKey(ctx, make([]byte, transport.MaxKeySize+1)), methodPut, wrapperspb.Bytes(nil), out); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversized key: %v", err)
	}
	if _, err := r.NewStream(ctx, repeatDesc, methodRepeat); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("stream without key: %v", err)
	}
	// Application errors are not retried.
	if err := r.Invoke(transport.WithKey(ctx, []byte("k")), "/tenure.transport.test.KV/Nope", wrapperspb.Bytes(nil), out); status.Code(err) != codes.Unimplemented || r.Stats().Retries != 0 {
		t.Fatalf("unknown method: %v, retries %d", err, r.Stats().Retries)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	before := r.Stats().Retries
	if _, err := put(ctx, r, "k"); status.Code(err) != codes.Canceled || r.Stats().Retries != before {
		t.Fatalf("after Close: %v, %d retries; want Canceled at once", err, r.Stats().Retries-before)
	}
}

func TestRouterConfigValidate(t *testing.T) {
	for _, c := range []RouterConfig{
		{},
		{Owners: &fakeOwners{}}, // no Membership
		{Owners: &fakeOwners{}, Membership: &fakeOwners{}, MaxRedirects: -1},
		{Owners: &fakeOwners{}, Membership: &fakeOwners{}, MaxAttempts: -1},
		{Owners: &fakeOwners{}, Membership: &fakeOwners{}, BackoffBase: -1},
		{Owners: &fakeOwners{}, Membership: &fakeOwners{}, MoveGrace: -1},
		{Owners: &fakeOwners{}, Membership: &fakeOwners{}, BackoffBase: time.Second, BackoffMax: time.Millisecond},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: valid", c)
		}
	}
	if err := (RouterConfig{Owners: &fakeOwners{}, Membership: &fakeOwners{}}).Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(RouterConfig{Owners: &fakeOwners{addr: "x"}, Membership: &fakeOwners{}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := 1; i < 40; i++ {
		if d := r.backoff(i); d < 0 || d > 500*time.Millisecond {
			t.Fatalf("backoff(%d) = %v", i, d)
		}
	}
	// Without credentials, dialing fails clearly, and is not retried.
	if _, err := put(testkit.Ctx(t, 5*time.Second), r, "k"); status.Code(err) != codes.Internal || r.Stats().Retries != 0 {
		t.Fatalf("no credentials: %v", err)
	}
}

// A node that answers not-owner with a new address on every call (hostile
// or misconfigured) makes the router dial no one but the members, and
// send no request anywhere else: before, the router dialed every address a
// hint named and kept the connection for its life (81 connections for one
// member after 20 calls), and followed a hint to a server that is no
// member, which served the call.
func TestRouterFollowsHintsOnlyToMembers(t *testing.T) {
	n := newBufNet(t)
	bystander := n.guarded("bystander", pointing(t, func() string { return "self" }))
	var hints atomic.Int64
	n.guarded("a", pointing(t, func() string {
		if i := hints.Add(1); i%4 != 0 {
			return fmt.Sprintf("elsewhere-%d", i)
		}
		return "bystander"
	}))
	r := n.router(ownedBy("a"), func(c *RouterConfig) { c.MaxAttempts = 1 })
	for i := range 20 {
		if _, err := put(testkit.Ctx(t, 10*time.Second), r, "k"); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("call %d: %v, want the not-owner answer", i, err)
		}
	}
	if got := len(*r.conns.Load()); got != 1 || hints.Load() < 20 {
		t.Errorf("after %d hints the router holds %d connections; want 1, the member's", hints.Load(), got)
	}
	if c := bystander.calls.Load(); c != 0 {
		t.Errorf("a server that is no member served %d calls a hint sent it", c)
	}
}

// Review of issue 19: a hint is followed to a member's address, and the
// node expected there is that member, not the name the hint gives. A hint
// that names another node ("liar") at the real owner's address made the
// router watch the wrong node: when gossip then showed the real owner's
// claim, the router took its own attempt at the owner for stale and
// cancelled it after MoveGrace.
func TestRouterExpectsTheMemberAtAHintsAddress(t *testing.T) {
	n := newBufNet(t)
	n.guarded("a", &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return nil, notOwner("liar", "b", 5) }})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	n.serveFunc("b", pointing(t, func() string { return "self" }), func(ctx context.Context) error {
		entered <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	owners := &fakeOwners{addr: "a"}
	owners.setMembers("a", "b")
	r := n.router(owners, func(cfg *RouterConfig) { cfg.MoveGrace = 20 * time.Millisecond })
	ctx := testkit.Ctx(t, 10*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := put(ctx, r, "k")
		done <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the hint was not followed to b")
	}
	owners.claim("n-b", "b") // gossip shows b, the member at the hint's address, holding it
	// 25 times MoveGrace: an attempt the router took for stale is
	// cancelled long before.
	deadline := time.After(500 * time.Millisecond)
	for r.Stats().Cancelled == 0 {
		select {
		case <-deadline:
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("put = %v", err)
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(release)
	t.Fatalf("the router cancelled its attempt at b, the owner it was sent to (stats %+v, put: %v)", r.Stats(), <-done)
}
