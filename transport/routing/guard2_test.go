package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gate"
	"github.com/tenure-go/tenure/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The guard checks the key a request names against the routed one when
// RequestKey says how to read it, and hands the routed key to the handler
// either way.
func TestGuardRoutedKey(t *testing.T) {
	n := newBufNet(t)
	lease := liveLease(t)
	leases := &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }}
	var ran int
	g, err := NewGuard(GuardConfig{Leases: leases, Stale: leases, RequestKey: func(req any) ([]byte, bool) {
		v, ok := req.(*wrapperspb.BytesValue)
		return v.GetValue(), ok && len(v.GetValue()) > 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	desc := grpc.ServiceDesc{
		ServiceName: "tenure.transport.test.KV",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{putMethod(func(_ any, ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
			ran++
			k, ok := RoutedKey(ctx)
			if !ok {
				return nil, status.Error(codes.Internal, "no routed key")
			}
			return wrapperspb.String(string(k)), nil
		})},
	}
	n.serve("self", func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) }, g.ServerOptions()...)
	owners := &fakeOwners{addr: "self"}
	r := n.router(owners, nil)
	ctx := testkit.Ctx(t, 10*time.Second)
	out := new(wrapperspb.StringValue)
	if err := r.Invoke(transport.WithKey(ctx, []byte("a")), methodPut, wrapperspb.Bytes([]byte("a")), out); err != nil || out.GetValue() != "a" {
		t.Fatalf("same key: %q %v", out.GetValue(), err)
	}
	if err := r.Invoke(transport.WithKey(ctx, []byte("a")), methodPut, wrapperspb.Bytes([]byte("b")), out); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("request for b routed by a: %v, want InvalidArgument", err)
	}
	if ran != 1 {
		t.Fatalf("handler ran %d times, want once", ran)
	}
	// A request that names no key is served under the routed one.
	if err := r.Invoke(transport.WithKey(ctx, []byte("c")), methodPut, wrapperspb.Bytes(nil), out); err != nil || out.GetValue() != "c" {
		t.Fatalf("keyless request: %q %v", out.GetValue(), err)
	}
}

// What a handler returns decides whether the client may retry: a closed
// gate (ErrLeaseEnded) is a handoff, nothing applied; an unknown outcome is
// passed on as one, even when it also wraps the lease's end.
func TestGuardGateAndOutcome(t *testing.T) {
	n := newBufNet(t)
	lease := liveLease(t)
	g := gate.New(testPartitions)
	var handler handlerFunc
	n.serveFunc("self", pointing(t, func() string { return "self" }), func(ctx context.Context) error { return handler(ctx) })
	cc := directConn(t, n, "self")
	ctx := testkit.Ctx(t, 10*time.Second)

	handler = func(context.Context) error {
		if err := g.Enter(lease); err != nil {
			return err
		}
		defer g.Exit(lease)
		return nil
	}
	if err := callWithKey(ctx, cc, "k"); !transport.IsHandoff(err) {
		t.Fatalf("closed gate: %v, want a handoff", err)
	}
	handler = func(context.Context) error {
		return fmt.Errorf("commit: %w (%w)", ownership.ErrOutcomeUnknown, ownership.ErrLeaseEnded)
	}
	if err := callWithKey(ctx, cc, "k"); !transport.IsOutcomeUnknown(err) || transport.IsHandoff(err) {
		t.Fatalf("unknown outcome: %v", err)
	}
}

// wrapped is a user's wrapper of the coordinator: it overrides Lease (to
// count calls, say) and embeds the rest.
type wrapped struct {
	*coordinator.Coordinator
	leases int
}

func (w *wrapped) Lease(key []byte) (*ownership.Lease, error) {
	w.leases++
	return w.Coordinator.Lease(key)
}

// A wrapper of the coordinator passed explicitly keeps stale reporting and
// membership following: nothing is found, or lost, behind a type assertion.
func TestWrappedCoordinator(t *testing.T) {
	c := singleNode(t, "solo", nil)
	w := &wrapped{Coordinator: c}
	n := newBufNet(t)
	var victim *ownership.Lease
	n.serveFunc("solo", w, func(ctx context.Context) error {
		l, _ := LeaseFrom(ctx)
		victim = l
		return ownership.Stale(l.Token(), ownership.Token{Partition: l.Partition(), Epoch: l.Token().Epoch + 1, Owner: "intruder"})
	})
	r := n.router(w, nil)
	ctx := testkit.Ctx(t, 20*time.Second)
	_, err := put(ctx, r, "k")
	if err == nil || victim == nil || w.leases == 0 {
		t.Fatalf("put = %v; the handler's stale write must fail it", err)
	}
	tenuretest.WaitFor(ctx, t, "the reported lease to end", func() bool { return victim.Err() != nil })
}
