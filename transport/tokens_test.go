package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/ownership"
)

// resource serves Put behind a TokenGuard and answers with the token it
// admitted, in text form.
func (n *bufNet) resource(addr string, cfg TokenGuardConfig) {
	g, err := NewTokenGuard(cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	answer := func(ctx context.Context) (*wrapperspb.StringValue, error) {
		tok, ok := TokenFrom(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no token in the handler's context")
		}
		text, err := tok.MarshalText()
		return wrapperspb.String(string(text)), err
	}
	desc := grpc.ServiceDesc{
		ServiceName: "tenure.transport.test.KV",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{putMethod(func(_ any, ctx context.Context, _ *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
			return answer(ctx)
		})},
		Streams: []grpc.StreamDesc{{StreamName: "Repeat", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			out, err := answer(ss.Context())
			if err != nil {
				return err
			}
			return ss.SendMsg(out)
		}}},
	}
	n.serve(addr, func(s *grpc.Server) { s.RegisterService(&desc, struct{}{}) }, g.ServerOptions()...)
}

func (n *bufNet) tokenConn(t *testing.T, addr string) *grpc.ClientConn {
	opts := append(n.dialOptions(),
		grpc.WithChainUnaryInterceptor(TokenUnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(TokenStreamClientInterceptor()))
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func putToken(ctx context.Context, cc grpc.ClientConnInterface) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), out)
	return out.GetValue(), err
}

func TestTokenGuard(t *testing.T) {
	keys, err := ownership.NewKeyring(ownership.Key(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	fence, err := ownership.NewMemoryFence(8)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	mark := keys.Sign(ownership.Token{Partition: 3, Epoch: 5, Owner: "b", Incarnation: 1})
	if _, err := fence.Fence(ctx, mark); err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	n.resource("res", TokenGuardConfig{Keyring: keys, Checker: FenceChecker(fence)})
	cc := n.tokenConn(t, "res")

	// The current token passes, and the handler sees it.
	got, err := putToken(WithToken(ctx, mark), cc)
	if err != nil || got != tokenString(t, mark) {
		t.Fatalf("current token: %q %v", got, err)
	}
	// A higher one fences the resource (Monotonic) and passes.
	next := keys.Sign(ownership.Token{Partition: 3, Epoch: 6, Owner: "c", Incarnation: 1})
	if _, err := putToken(WithToken(ctx, next), cc); err != nil {
		t.Fatalf("next token: %v", err)
	}
	// The old one is now stale: the refusal carries the current token.
	_, err = putToken(WithToken(ctx, mark), cc)
	st, ok := StaleFromStatus(err)
	if status.Code(err) != codes.FailedPrecondition || !ok || st.Current != next || st.Token != mark {
		t.Fatalf("stale: %v (%+v %v)", err, st, ok)
	}
	// Unsigned, or signed by another key: Unauthenticated.
	if _, err := putToken(WithToken(ctx, ownership.Token{Partition: 3, Epoch: 9, Owner: "x"}), cc); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unsigned: %v", err)
	}
	forged := next
	forged.Epoch = 100
	if _, err := putToken(WithToken(ctx, forged), cc); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged: %v", err)
	}
	if fence.Current(3) != next {
		t.Fatal("a refused token moved the fence")
	}
	// No token, a malformed, oversized or repeated one: InvalidArgument.
	for name, md := range map[string]metadata.MD{
		"none":      {},
		"malformed": metadata.Pairs(TokenMetadata, "v1.???"),
		"oversized": metadata.Pairs(TokenMetadata, strings.Repeat("A", ownership.MaxTokenTextSize+1)),
		"repeated":  metadata.Pairs(TokenMetadata, tokenString(t, next), TokenMetadata, tokenString(t, next)),
	} {
		if _, err := putToken(metadata.NewOutgoingContext(ctx, md), cc); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A partition the fence doesn't have.
	if _, err := putToken(WithToken(ctx, keys.Sign(ownership.Token{Partition: 99, Epoch: 1, Owner: "x"})), cc); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("partition out of range: %v", err)
	}
	// Streams carry and check tokens too.
	cs, err := cc.NewStream(WithToken(ctx, next), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	var out wrapperspb.StringValue
	if err := cs.RecvMsg(&out); err != nil || out.GetValue() != tokenString(t, next) {
		t.Fatalf("stream: %q %v", out.GetValue(), err)
	}
	cs, err = cc.NewStream(WithToken(ctx, mark), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&out); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale stream: %v", err)
	}
}

func TestTokenGuardCheckerErrors(t *testing.T) {
	n := newBufNet(t)
	var answer error
	n.resource("res", TokenGuardConfig{Checker: CheckerFunc(func(context.Context, ownership.Token) error { return answer })})
	cc := n.tokenConn(t, "res")
	ctx := WithToken(testCtx(t, 10*time.Second), testToken())
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{nil, codes.OK},
		{ownership.ErrNotFenced, codes.FailedPrecondition},
		{ownership.ErrConflict, codes.Aborted},
		{errors.New("database down"), codes.Unavailable},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
	} {
		answer = tc.err
		if _, err := putToken(ctx, cc); status.Code(err) != tc.code {
			t.Errorf("%v: %v, want %v", tc.err, err, tc.code)
		}
	}
}

// A handler behind an OwnerGuard calls a resource with its own context: the
// lease's token goes along.
func TestTokenFollowsLease(t *testing.T) {
	n := newBufNet(t)
	n.resource("res", TokenGuardConfig{})
	res := n.tokenConn(t, "res")
	lease := liveLease(t)
	n.serveFunc("owner", &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }}, func(ctx context.Context) error {
		got, err := putToken(ctx, res)
		if err != nil {
			return err
		}
		if got != tokenString(t, lease.Token()) {
			return status.Errorf(codes.Internal, "resource saw %q", got)
		}
		return nil
	})
	if err := callWithKey(testCtx(t, 10*time.Second), directConn(t, n, "owner"), "k"); err != nil {
		t.Fatal(err)
	}
	// Without a lease or WithToken, no token is sent.
	if _, err := putToken(testCtx(t, 10*time.Second), res); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no token: %v", err)
	}
	// An unencodable token fails on the client.
	bad := testToken()
	bad.Owner = strings.Repeat("x", 300)
	if _, err := putToken(WithToken(testCtx(t, 10*time.Second), bad), res); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unencodable: %v", err)
	}
}
