package transport

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// A Checker judges the token of a call to a resource server before its
// handler runs: nil lets the call through; a *ownership.StaleTokenError,
// ownership.ErrNotFenced or ownership.ErrBadMAC refuses it (see
// StatusFromError). Check is called concurrently and may block (I/O) until
// ctx ends.
type Checker interface {
	Check(ctx context.Context, t ownership.Token) error
}

// CheckerFunc adapts a function to a Checker.
type CheckerFunc func(ctx context.Context, t ownership.Token) error

// Check calls f.
func (f CheckerFunc) Check(ctx context.Context, t ownership.Token) error { return f(ctx, t) }

// FenceChecker checks tokens against f in the Monotonic way: a token below
// the partition's mark is stale, and a higher one fences the partition
// (advances the mark) before its call runs. For a MemoryFence in Exact mode
// use CheckerFunc with MemoryFence.Check, or check inside the handler with
// MemoryFence.Do so the check and the write are atomic.
func FenceChecker(f ownership.Fence) Checker {
	return CheckerFunc(func(ctx context.Context, t ownership.Token) error {
		_, err := f.Fence(ctx, t)
		return err
	})
}

// TokenGuardConfig configures a TokenGuard.
type TokenGuardConfig struct {
	// Keyring, when set, verifies every token's MAC: a token that fails is
	// refused with Unauthenticated. Default nil: MACs are not checked (any
	// client can then present any token).
	Keyring *ownership.Keyring
	// Checker, when set, judges every token before the handler runs.
	// Default nil: the token is only decoded (and verified), and the handler
	// judges it (TokenFrom) - the only race-free choice when the check and
	// the write must be atomic.
	Checker Checker
	// Exempt reports whether a method (its full name) is served without a
	// token. Default DefaultExempt.
	Exempt func(fullMethod string) bool
}

// Validate reports whether c can build a guard. Every TokenGuardConfig is
// valid; Validate exists for symmetry and future fields.
func (c TokenGuardConfig) Validate() error { return nil }

// A TokenGuard protects a resource server: its interceptors read the
// fencing token of each call (TokenMetadata), verify its MAC and run the
// Checker, and give the handler the token (TokenFrom). It refuses a call:
//
//   - without a token, or with a repeated, oversized or malformed one:
//     InvalidArgument;
//   - whose token's MAC fails: Unauthenticated;
//   - whose token is stale: FailedPrecondition with a ReasonStaleToken
//     detail carrying the resource's current token (StaleFromStatus);
//   - whose token is not fenced yet (Exact checks): FailedPrecondition with
//     a ReasonNotFenced detail.
//
// A TokenGuard is safe for concurrent use.
type TokenGuard struct {
	keys    *ownership.Keyring
	checker Checker
	exempt  func(string) bool
}

// NewTokenGuard returns a guard for cfg.
func NewTokenGuard(cfg TokenGuardConfig) (*TokenGuard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &TokenGuard{keys: cfg.Keyring, checker: cfg.Checker, exempt: cfg.Exempt}
	if g.exempt == nil {
		g.exempt = DefaultExempt
	}
	return g, nil
}

// ServerOptions returns the guard's interceptors as server options.
func (g *TokenGuard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.Unary()),
		grpc.ChainStreamInterceptor(g.Stream()),
	}
}

// Unary returns the guard's unary server interceptor.
func (g *TokenGuard) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if g.exempt(info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, err := g.admit(ctx)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the guard's stream server interceptor. The token is
// checked once, when the stream opens.
func (g *TokenGuard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if g.exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, err := g.admit(ss.Context())
		if err != nil {
			return err
		}
		return handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
	}
}

type callTokenCtx struct{}

// TokenFrom returns the token a TokenGuard admitted for the call.
func TokenFrom(ctx context.Context) (ownership.Token, bool) {
	t, ok := ctx.Value(callTokenCtx{}).(ownership.Token)
	return t, ok
}

func (g *TokenGuard) admit(ctx context.Context) (context.Context, error) {
	t, ok, err := decodeToken(metadata.ValueFromIncomingContext(ctx, TokenMetadata))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "tenure: the call carries no fencing token (metadata "+TokenMetadata+")")
	}
	if err := g.keys.Verify(t); err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if g.checker != nil {
		if err := g.checker.Check(ctx, t); err != nil {
			return nil, checkStatus(err)
		}
	}
	return context.WithValue(ctx, callTokenCtx{}, t), nil
}

// checkStatus converts a Checker's error; an error tenure does not know
// (the resource's I/O failing) becomes Unavailable.
func checkStatus(err error) error {
	st := StatusFromError(err)
	if _, ok := status.FromError(st); ok {
		return st
	}
	if errors.Is(err, ownership.ErrConflict) {
		return status.Error(codes.Aborted, err.Error())
	}
	return status.Error(codes.Unavailable, "tenure: token check failed: "+err.Error())
}

// TokenUnaryClientInterceptor returns a client interceptor that sends the
// call's token in TokenMetadata: the one set by WithToken, else the token of
// the lease an OwnerGuard put in ctx (a handler calling a resource with its
// own context). A call with neither is sent as it is.
func TokenUnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, err := withCallToken(ctx)
		if err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// TokenStreamClientInterceptor is TokenUnaryClientInterceptor for streams.
func TokenStreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := withCallToken(ctx)
		if err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

func withCallToken(ctx context.Context) (context.Context, error) {
	t, ok := tokenForCall(ctx)
	if !ok {
		return ctx, nil
	}
	ctx, err := AppendToken(ctx, t)
	if err != nil {
		return ctx, status.Error(codes.InvalidArgument, err.Error())
	}
	return ctx, nil
}
