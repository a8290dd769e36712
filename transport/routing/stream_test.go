package routing

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/transport"
)

func count(ctx context.Context, t *testing.T, r *Router, msgs int) (string, error) {
	t.Helper()
	cs, err := r.NewStream(transport.WithKey(ctx, []byte("k")), countDesc, methodCount)
	if err != nil {
		return "", err
	}
	for range msgs {
		if err := cs.SendMsg(wrapperspb.Bytes([]byte("m"))); err != nil {
			if err == io.EOF {
				break
			}
			return "", err
		}
	}
	if err := cs.CloseSend(); err != nil {
		return "", err
	}
	var out wrapperspb.StringValue
	err = cs.RecvMsg(&out)
	return out.GetValue(), err
}

func TestRouterStreamReplays(t *testing.T) {
	n := newBufNet(t)
	n.guarded("a", pointing(t, func() string { return "b" }))
	var refusals atomic.Int64
	refusals.Store(2)
	n.guarded("b", pointing(t, func() string {
		if refusals.Add(-1) >= 0 {
			return "" // a handoff, twice
		}
		return "self"
	}))
	r := n.router(ownedBy("a", "b"), nil)
	ctx := testkit.Ctx(t, 10*time.Second)

	got, err := count(ctx, t, r, 5)
	if err != nil || got != "b:5" {
		t.Fatalf("client stream: %q %v, want b:5", got, err)
	}
	// a -> b (handoff, pause), a -> b (handoff, pause), a -> b: each pause
	// starts again from Owners.
	if st := r.Stats(); st.Redirects != 3 || st.Retries != 2 {
		t.Fatalf("stats %+v", st)
	}

	// A server stream: the request is replayed, then every response comes
	// from the owner.
	cs, err := r.NewStream(transport.WithKey(ctx, []byte("k")), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.Bytes(nil)); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		var out wrapperspb.StringValue
		if err := cs.RecvMsg(&out); err != nil || out.GetValue() != "b" {
			t.Fatalf("response %d: %q %v", i, out.GetValue(), err)
		}
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != io.EOF {
		t.Fatalf("end of stream: %v", err)
	}
	if _, err := cs.Header(); err != nil {
		t.Fatal(err)
	}
	_ = cs.Trailer()
	if cs.Context() == nil {
		t.Fatal("nil context")
	}
}

func TestRouterStreamReplayLimit(t *testing.T) {
	n := newBufNet(t)
	n.guarded("a", pointing(t, func() string { return "b" }))
	n.guarded("b", pointing(t, func() string { return "self" }))
	ctx := testkit.Ctx(t, 10*time.Second)

	r := n.router(ownedBy("a", "b"), func(c *RouterConfig) { c.StreamReplay = 2 })
	if _, err := count(ctx, t, r, 3); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("3 messages, replay limit 2: %v", err)
	}
	if got, err := count(ctx, t, r, 2); err != nil || got != "b:2" {
		t.Fatalf("2 messages, replay limit 2: %q %v", got, err)
	}
	r = n.router(ownedBy("a", "b"), func(c *RouterConfig) { c.StreamReplay = -1 })
	if _, err := count(ctx, t, r, 1); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replay off: %v", err)
	}
}

func TestRouterStreamWaitsForOwner(t *testing.T) {
	n := newBufNet(t)
	owners := &fakeOwners{addr: "dead"}
	n.guarded("b", pointing(t, func() string { return "self" }))
	r := n.router(owners, func(c *RouterConfig) { c.MaxAttempts = 2 })
	if _, err := count(testkit.Ctx(t, 10*time.Second), t, r, 1); status.Code(err) != codes.Unavailable {
		t.Fatalf("dead owner: %v", err)
	}
	owners.set("b")
	if got, err := count(testkit.Ctx(t, 10*time.Second), t, r, 1); err != nil || got != "b:1" {
		t.Fatalf("live owner: %q %v", got, err)
	}
}
