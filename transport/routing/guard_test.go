package routing

import (
	"context"
	"errors"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// directConn dials addr on n without routing.
func directConn(t *testing.T, n *bufNet, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, n.dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func callWithKey(ctx context.Context, cc grpc.ClientConnInterface, key string) error {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, transport.KeyMetadata, key)
	}
	return cc.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), new(wrapperspb.StringValue))
}

func TestGuardWithCoordinator(t *testing.T) {
	fence, err := ownership.NewMemoryFence(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	c := singleNode(t, "solo", fence)
	n := newBufNet(t)
	s := n.guarded("solo", c)
	s.fence, s.log = fence, newWriteLog()
	cc := directConn(t, n, "solo")
	ctx := testkit.Ctx(t, 10*time.Second)

	for _, key := range []string{"a", "b", "user-42", "\x00\xff"} {
		if err := callWithKey(ctx, cc, key); err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
	}
	checkLog(t, s.log)
	if s.log.total != 4 {
		t.Fatalf("%d writes, want 4", s.log.total)
	}
	if err := callWithKey(ctx, cc, ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no key: %v", err)
	}
}

func TestGuardRefusals(t *testing.T) {
	n := newBufNet(t)
	lease := liveLease(t)
	var answer error
	leases := &fakeLeases{lease: func([]byte) (*ownership.Lease, error) {
		if answer != nil {
			return nil, answer
		}
		return lease, nil
	}}
	n.guarded("self", leases)
	cc := directConn(t, n, "self")
	ctx := testkit.Ctx(t, 10*time.Second)

	answer = notOwner("other", "other:1", 4)
	err := callWithKey(ctx, cc, "k")
	if o, ok := transport.OwnerHint(err); !ok || o.Node != "other" || o.Addr != "other:1" || o.Token.Epoch != 4 {
		t.Fatalf("not owner: %v (hint %+v %v)", err, o, ok)
	}

	answer = notOwner("self", "self", 0) // the ring says us: a handoff
	if err := callWithKey(ctx, cc, "k"); status.Code(err) != codes.Unavailable || !transport.IsHandoff(err) {
		t.Fatalf("handoff: %v", err)
	}

	answer = ownership.ErrNoOwner
	if err := callWithKey(ctx, cc, "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("no owner: %v", err)
	}

	answer = errors.New("something else")
	if err := callWithKey(ctx, cc, "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("other error: %v", err)
	}

	answer = nil
	if err := callWithKey(ctx, cc, "k"); err != nil {
		t.Fatalf("owner: %v", err)
	}
}

// handlerFunc is a one-method unary service for guard tests.
type handlerFunc func(ctx context.Context) error

func (n *bufNet) serveFunc(addr string, leases nodeLeases, h handlerFunc) {
	g, err := NewGuard(GuardConfig{Leases: leases, Stale: leases})
	if err != nil {
		n.t.Fatal(err)
	}
	desc := grpc.ServiceDesc{
		ServiceName: "tenure.transport.test.KV",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{putMethod(func(_ any, ctx context.Context, _ *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String("ok"), h(ctx)
		})},
	}
	n.serve(addr, func(s *grpc.Server) {
		s.RegisterService(&desc, struct{}{})
		healthgrpc.RegisterHealthServer(s, health.NewServer())
	}, g.ServerOptions()...)
}

func TestGuardHandlerErrors(t *testing.T) {
	n := newBufNet(t)
	lctx, end := context.WithCancel(context.Background())
	defer end()
	lease := ownership.NewLease(lctx, ownership.Token{Partition: 3, Epoch: 2, Owner: "self", Incarnation: 7})
	leases := &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }}
	var handler handlerFunc
	n.serveFunc("self", leases, func(ctx context.Context) error { return handler(ctx) })
	cc := directConn(t, n, "self")
	ctx := testkit.Ctx(t, 10*time.Second)

	// The handler sees the lease.
	handler = func(ctx context.Context) error {
		if l, ok := LeaseFrom(ctx); !ok || l != lease {
			return status.Error(codes.Internal, "no lease")
		}
		return nil
	}
	if err := callWithKey(ctx, cc, "k"); err != nil {
		t.Fatal(err)
	}

	// A stale rejection of our own token: reported, and a handoff.
	handler = func(context.Context) error {
		return ownership.Stale(lease.Token(), ownership.Token{Partition: 3, Epoch: 3, Owner: "other"})
	}
	if err := callWithKey(ctx, cc, "k"); !transport.IsHandoff(err) || leases.reported.Load() != 1 {
		t.Fatalf("own stale token: %v, reported %d", err, leases.reported.Load())
	}

	// Someone else's stale token: passed on as FailedPrecondition.
	handler = func(context.Context) error {
		return ownership.Stale(ownership.Token{Partition: 3, Epoch: 1, Owner: "x"}, lease.Token())
	}
	if err := callWithKey(ctx, cc, "k"); status.Code(err) != codes.FailedPrecondition || leases.reported.Load() != 1 {
		t.Fatalf("foreign stale token: %v", err)
	}

	// A fence's other errors are mapped.
	handler = func(context.Context) error { return ownership.ErrBadMAC }
	if err := callWithKey(ctx, cc, "k"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("bad MAC: %v", err)
	}

	// The lease ends during the call: the handler's context is cancelled
	// and the client is told to retry.
	handler = func(ctx context.Context) error {
		end()
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), context.Canceled) {
			return status.Errorf(codes.Internal, "cause %v", context.Cause(ctx))
		}
		return ctx.Err()
	}
	if err := callWithKey(ctx, cc, "k"); !transport.IsHandoff(err) {
		t.Fatalf("lease ended: %v", err)
	}

	// Exempt methods need no key.
	hc := healthgrpc.NewHealthClient(cc)
	if _, err := hc.Check(ctx, &healthgrpc.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check through the guard: %v", err)
	}
}

func TestGuardStream(t *testing.T) {
	n := newBufNet(t)
	lease := liveLease(t)
	n.guarded("self", &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }})
	cc := directConn(t, n, "self")
	ctx := metadata.AppendToOutgoingContext(testkit.Ctx(t, 10*time.Second), transport.KeyMetadata, "k")
	cs, err := cc.NewStream(ctx, repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.Bytes(nil)); err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	var got wrapperspb.StringValue
	if err := cs.RecvMsg(&got); err != nil || got.GetValue() != "self" {
		t.Fatalf("stream: %q %v", got.GetValue(), err)
	}
	// Without a key, the stream is refused.
	cs, err = cc.NewStream(testkit.Ctx(t, 10*time.Second), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(wrapperspb.Bytes(nil))
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&got); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("keyless stream: %v", err)
	}
}

func TestGuardConfigValidate(t *testing.T) {
	if _, err := NewGuard(GuardConfig{}); err == nil {
		t.Fatal("a guard without leases")
	}
	if !transport.DefaultExempt("/grpc.health.v1.Health/Check") || !transport.DefaultExempt(pb.Ownership_Lookup_FullMethodName) || transport.DefaultExempt(methodPut) {
		t.Fatal("transport.DefaultExempt")
	}
}

// A not-owner answer names the owner in plain trailing metadata too, for
// clients that don't decode the status's detail (grpcurl, other
// languages), percent-encoded as grpc-message is; other answers carry no
// such trailer.
func TestGuardNotOwnerTrailer(t *testing.T) {
	n := newBufNet(t)
	owner := "nöde b%"
	var served atomic.Bool
	lease := liveLease(t)
	n.guarded("a", &fakeLeases{lease: func([]byte) (*ownership.Lease, error) {
		if !served.Load() {
			return nil, notOwner(owner, "10.0.0.2:7000", 5)
		}
		return lease, nil
	}})
	cc := directConn(t, n, "a")
	ctx := metadata.AppendToOutgoingContext(testkit.Ctx(t, 10*time.Second), transport.KeyMetadata, "k")

	var trailer metadata.MD
	err := cc.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), new(wrapperspb.StringValue), grpc.Trailer(&trailer))
	if _, ok := transport.OwnerHint(err); !ok {
		t.Fatalf("want a not-owner answer, got %v", err)
	}
	if got := trailer.Get(transport.OwnerMetadata); len(got) != 1 || got[0] != "n%C3%B6de b%25" {
		t.Errorf("%s = %q, want the owner's name percent-encoded", transport.OwnerMetadata, got)
	} else if name, err := url.PathUnescape(got[0]); err != nil || name != owner {
		t.Errorf("%q decodes to %q (%v), want %q", got[0], name, err, owner)
	}
	if got := trailer.Get(transport.OwnerAddrMetadata); len(got) != 1 || got[0] != "10.0.0.2:7000" {
		t.Errorf("%s = %q, want 10.0.0.2:7000", transport.OwnerAddrMetadata, got)
	}

	// A stream's refusal carries it too.
	s, err := cc.NewStream(ctx, countDesc, methodCount)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(new(wrapperspb.StringValue)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stream: %v, want the not-owner answer", err)
	}
	if got := s.Trailer().Get(transport.OwnerAddrMetadata); len(got) != 1 || got[0] != "10.0.0.2:7000" {
		t.Errorf("stream: %s = %q", transport.OwnerAddrMetadata, got)
	}

	// Negative control: an answer that is not a refusal names no owner.
	served.Store(true)
	trailer = nil
	if err := cc.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), new(wrapperspb.StringValue), grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if got := trailer.Get(transport.OwnerMetadata); len(got) != 0 {
		t.Errorf("a served call's trailer names an owner: %q", got)
	}
}
