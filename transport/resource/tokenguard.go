package resource

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// A Checker judges the token of a call before its handler runs: nil lets
// the call through; a *ownership.StaleTokenError, ownership.ErrNotFenced or
// ownership.ErrBadMAC refuses it (see transport.StatusFromError). Check is
// called concurrently and may block (I/O) until ctx ends.
//
// A Checker only checks. The partition's mark can move between the check
// and the handler's write, so a check-only guard does not fence the
// handler's writes: a write under epoch 1 can land after epoch 2 was
// fenced. Use TokenGuardConfig.Fence for that, or check the token inside
// the write's own fenced transaction.
type Checker interface {
	Check(ctx context.Context, t ownership.Token) error
}

// CheckerFunc adapts a function to a Checker.
type CheckerFunc func(ctx context.Context, t ownership.Token) error

// Check calls f.
func (f CheckerFunc) Check(ctx context.Context, t ownership.Token) error { return f(ctx, t) }

// A Doer runs fn while t is current for its partition under mode m, the
// check and fn's writes atomic: no fence of a higher token completes while
// fn runs, and if the check fails fn does not run. *ownership.MemoryFence
// implements it.
type Doer interface {
	Do(ctx context.Context, t ownership.Token, m ownership.Mode, fn func() error) error
}

// TokenGuardConfig configures a TokenGuard.
type TokenGuardConfig struct {
	// Keyring, when set, verifies every token's MAC: a token that fails is
	// refused with Unauthenticated. Default nil: MACs are not checked (any
	// client can then present any token).
	Keyring *ownership.Keyring
	// Fence, when set, runs each call's handler inside Fence.Do under the
	// call's token and Mode: the token is judged, and every write the
	// handler makes before it returns is atomic with that judgement (S1
	// holds for them). A stream's whole handler runs inside one Do, which
	// holds off the partition's fences until the stream ends: keep fenced
	// streams short. Default nil: the handler judges the token itself
	// (TokenFrom), for example in its own SQL transaction with
	// sqlfence.Fence.Do.
	Fence Doer
	// Mode is how Fence judges tokens. Default ownership.Exact: writers
	// fence before they write. Use ownership.Monotonic for a resource its
	// writers reach without fencing first: a higher token then advances
	// the mark.
	Mode ownership.Mode
	// Checker, when set, judges every token before the handler runs (and
	// before Fence). It only checks (see Checker): with Fence nil it does
	// not fence the handler's writes. Default nil.
	Checker Checker
	// Exempt reports whether a method (its full name) is served without a
	// token. Default transport.DefaultExempt.
	Exempt func(fullMethod string) bool
	// Signer, when set, signs the current token of every stale answer the
	// guard itself gives (from Checker or Fence; not a handler's own
	// errors, which may name another resource's mark). A coordinator with
	// Config.TokenKeys believes a current token only with a valid MAC, and
	// fences such as sqlfence keep marks without theirs: set it, with
	// Keyring, to the cluster's keyring. Default nil: current tokens are
	// returned as the Checker or Fence gave them.
	Signer interface {
		Sign(ownership.Token) ownership.Token
	}
}

// Validate reports whether c can build a guard. It does not change c.
func (c TokenGuardConfig) Validate() error {
	if c.Mode != ownership.Exact && c.Mode != ownership.Monotonic {
		return errors.New("resource: TokenGuardConfig.Mode is neither Exact nor Monotonic")
	}
	return nil
}

// A TokenGuard protects a resource server: its interceptors read the
// fencing token of each call (transport.TokenMetadata), verify its MAC, run
// the Checker, and run the handler (inside Fence.Do when Fence is set) with
// the token in its context (TokenFrom). It refuses a call:
//
//   - without a token, or with a repeated, oversized or malformed one:
//     InvalidArgument;
//   - whose token's MAC fails: Unauthenticated;
//   - whose token is stale: FailedPrecondition with a ReasonStaleToken
//     detail carrying the resource's current token
//     (transport.StaleFromStatus);
//   - whose token is not fenced yet (Exact): FailedPrecondition with a
//     ReasonNotFenced detail.
//
// A handler's own errors are converted with transport.StatusFromError.
//
// A TokenGuard is safe for concurrent use.
type TokenGuard struct {
	keys   *ownership.Keyring
	signer interface {
		Sign(ownership.Token) ownership.Token
	}
	checker Checker
	fence   Doer
	mode    ownership.Mode
	exempt  func(string) bool
}

// NewTokenGuard returns a guard for cfg.
func NewTokenGuard(cfg TokenGuardConfig) (*TokenGuard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &TokenGuard{keys: cfg.Keyring, signer: cfg.Signer, checker: cfg.Checker, fence: cfg.Fence, mode: cfg.Mode, exempt: cfg.Exempt}
	if g.exempt == nil {
		g.exempt = transport.DefaultExempt
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
		ctx, t, err := g.admit(ctx)
		if err != nil {
			return nil, err
		}
		var resp any
		err = g.run(ctx, t, func() (err error) {
			resp, err = handler(ctx, req)
			return err
		})
		return resp, err
	}
}

// Stream returns the guard's stream server interceptor. The token is
// checked once, when the stream opens.
func (g *TokenGuard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if g.exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, t, err := g.admit(ss.Context())
		if err != nil {
			return err
		}
		return g.run(ctx, t, func() error { return handler(srv, &serverStream{ServerStream: ss, ctx: ctx}) })
	}
}

// run runs the handler h, inside Fence.Do when the guard has a Fence.
func (g *TokenGuard) run(ctx context.Context, t ownership.Token, h func() error) error {
	if g.fence == nil {
		return transport.StatusFromError(h())
	}
	var herr error
	ran := false
	err := g.fence.Do(ctx, t, g.mode, func() error {
		ran = true
		herr = h()
		return herr
	})
	if ran {
		return transport.StatusFromError(herr)
	}
	return checkStatus(g.signStale(err))
}

// signStale returns err with the current token of its
// *ownership.StaleTokenError signed by the guard's Signer, if it has one.
func (g *TokenGuard) signStale(err error) error {
	var st *ownership.StaleTokenError
	if g.signer == nil || !errors.As(err, &st) || st.Current.IsZero() {
		return err
	}
	return ownership.Stale(st.Token, g.signer.Sign(st.Current))
}

type callTokenCtx struct{}

// TokenFrom returns the token a TokenGuard admitted for the call being
// served with ctx.
func TokenFrom(ctx context.Context) (ownership.Token, bool) {
	t, ok := ctx.Value(callTokenCtx{}).(ownership.Token)
	return t, ok
}

func (g *TokenGuard) admit(ctx context.Context) (context.Context, ownership.Token, error) {
	t, ok, err := transport.TokenFromIncoming(ctx)
	if err != nil {
		return nil, t, err
	}
	if !ok {
		return nil, t, status.Error(codes.InvalidArgument, "tenure: the call carries no fencing token (metadata "+transport.TokenMetadata+")")
	}
	if err := g.keys.Verify(t); err != nil {
		return nil, t, status.Error(codes.Unauthenticated, err.Error())
	}
	if g.checker != nil {
		if err := g.checker.Check(ctx, t); err != nil {
			return nil, t, checkStatus(g.signStale(err))
		}
	}
	// The handler's own calls to further resources carry the token too.
	return transport.WithToken(context.WithValue(ctx, callTokenCtx{}, t), t), t, nil
}

// checkStatus converts a check's error; an error tenure does not know (the
// resource's I/O failing) becomes Unavailable.
func checkStatus(err error) error {
	st := transport.StatusFromError(err)
	if _, ok := status.FromError(st); ok {
		return st
	}
	if errors.Is(err, ownership.ErrConflict) {
		return status.Error(codes.Aborted, err.Error())
	}
	return status.Error(codes.Unavailable, "tenure: token check failed: "+err.Error())
}

// serverStream replaces a stream's context with the guarded one.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
