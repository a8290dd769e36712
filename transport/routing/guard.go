package routing

import (
	"bytes"
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// Leases is what an OwnerGuard asks of the node's coordinator;
// *coordinator.Coordinator implements it. Both methods are called
// concurrently on every call and must not block.
type Leases interface {
	// Lease returns this node's live lease on key's partition, or an error
	// holding a *ownership.NotOwnerError that names the owner.
	Lease(key []byte) (*ownership.Lease, error)
	// Self names this node.
	Self() ownership.Node
}

// StaleReporter is told of a handler's write that a fence refused under
// this node's own token; *coordinator.Coordinator implements it
// (ReportStale ends the lease at once). It is called concurrently and must
// not block for long.
type StaleReporter interface {
	ReportStale(err error) bool
}

// GuardConfig configures an OwnerGuard.
type GuardConfig struct {
	// Leases answers which partitions this node owns. Required: the node's
	// *coordinator.Coordinator (or a wrapper of it).
	Leases Leases
	// Stale is told when a handler's write was refused as stale under this
	// node's token, so the lease ends at once instead of when gossip brings
	// the news. Required: the node's *coordinator.Coordinator (or a
	// wrapper of it). A wrapper of the coordinator passed as Leases must
	// still set it: the guard does not look for it behind Leases.
	Stale StaleReporter
	// RequestKey, when set, returns the key a unary request names (for
	// example the key field of a generated request message), and ok false
	// for a request that names none. The guard refuses, with
	// InvalidArgument and before the handler runs, a call whose request
	// names another key than the one it was routed by: the lease the guard
	// checked is the routed key's, and would not cover the other key.
	// Streams are not checked (the request is not known when they open):
	// compare with RoutedKey in the handler. Default nil: the handler
	// compares (RoutedKey).
	RequestKey func(req any) (key []byte, ok bool)
	// Exempt reports whether a method (its full name, "/pkg.Service/Method")
	// is served without a key and without an ownership check. Default
	// transport.DefaultExempt: the health, reflection and ownership
	// services. A function of your own should exempt those too.
	Exempt func(fullMethod string) bool
}

// Validate reports whether c can build a guard. It does not change c.
func (c GuardConfig) Validate() error {
	switch {
	case c.Leases == nil:
		return errors.New("routing: GuardConfig.Leases is nil")
	case c.Stale == nil:
		return errors.New("routing: GuardConfig.Stale is nil (set it to the coordinator)")
	}
	return nil
}

// An OwnerGuard lets through only the calls whose key this node owns. Its
// interceptors read the key from the call's metadata
// (transport.KeyMetadata), and:
//
//   - when the node holds the partition's lease, run the handler with a
//     context that carries the lease (LeaseFrom), the routed key
//     (RoutedKey) and the lease's token for the handler's own calls
//     (transport.WithToken), and that is cancelled when the lease ends;
//   - when another node owns it, answer FailedPrecondition with a
//     ReasonNotOwner detail naming the owner, its address and epoch, and
//     the owner's name and address in plain trailing metadata too
//     (transport.NotOwnerTrailer), for clients that don't decode details;
//   - when the ring gives the partition to this node but it holds no lease
//     (a handoff), answer Unavailable with a ReasonHandoff detail;
//   - when the key is missing, empty, repeated or too long, or the request
//     names another key (GuardConfig.RequestKey), answer InvalidArgument.
//
// A handler's error is converted with transport.StatusFromError, except:
//
//   - an error wrapping ownership.ErrOutcomeUnknown (a commit whose answer
//     was lost) becomes a ReasonOutcomeUnknown status, whatever else it
//     wraps: the write may have been applied;
//   - an error wrapping ownership.ErrLeaseEnded (a closed gate, a lease
//     that ended), a cancellation caused by the lease ending, and a
//     *ownership.StaleTokenError for this node's own token (also passed to
//     GuardConfig.Stale) become a ReasonHandoff Unavailable, so the client
//     retries at the next owner. These mean "not applied": the handler
//     must only return them for a write that did not commit (sqlfence.Do
//     returns ErrOutcomeUnknown, not a cancellation, for a commit it sent).
//
// An OwnerGuard is safe for concurrent use.
type OwnerGuard struct {
	leases     Leases
	stale      StaleReporter
	requestKey func(any) ([]byte, bool)
	exempt     func(string) bool
}

// NewGuard returns a guard for cfg.
func NewGuard(cfg GuardConfig) (*OwnerGuard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &OwnerGuard{leases: cfg.Leases, stale: cfg.Stale, requestKey: cfg.RequestKey, exempt: cfg.Exempt}
	if g.exempt == nil {
		g.exempt = transport.DefaultExempt
	}
	return g, nil
}

// ServerOptions returns the guard's unary and stream interceptors as
// server options, chained after any interceptor already given.
func (g *OwnerGuard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(g.Unary()),
		grpc.ChainStreamInterceptor(g.Stream()),
	}
}

// Unary returns the guard's unary server interceptor.
func (g *OwnerGuard) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if g.exempt(info.FullMethod) {
			return handler(ctx, req)
		}
		call, err := g.enter(ctx)
		if err != nil {
			return nil, withOwnerTrailer(err, func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
		}
		if g.requestKey != nil {
			if k, ok := g.requestKey(req); ok && !bytes.Equal(k, call.key) {
				call.exit(nil)
				return nil, errKeyMismatch
			}
		}
		resp, err := handler(call.ctx, req)
		return resp, withOwnerTrailer(call.exit(err), func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
	}
}

// withOwnerTrailer sets, through set, the trailing metadata that names the
// owner when err is a not-owner answer (transport.NotOwnerTrailer), for
// clients that don't read the status's detail. It returns err.
func withOwnerTrailer(err error, set func(metadata.MD) error) error {
	if md := transport.NotOwnerTrailer(err); md != nil {
		_ = set(md) // fails only once the call has ended
	}
	return err
}

var errKeyMismatch = status.Error(codes.InvalidArgument, "tenure: the request's key differs from the call's routing key")

// Stream returns the guard's stream server interceptor.
func (g *OwnerGuard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if g.exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		set := func(md metadata.MD) error { ss.SetTrailer(md); return nil }
		call, err := g.enter(ss.Context())
		if err != nil {
			return withOwnerTrailer(err, set)
		}
		return withOwnerTrailer(call.exit(handler(srv, &serverStream{ServerStream: ss, ctx: call.ctx})), set)
	}
}

// guardedCall is one call let through by the guard; it is also the value
// the handler's context carries (LeaseFrom, RoutedKey).
type guardedCall struct {
	g      *OwnerGuard
	parent context.Context
	ctx    context.Context
	lease  *ownership.Lease
	key    []byte
	cancel context.CancelCauseFunc
	stop   func() bool
}

type guardedCtx struct{}

// LeaseFrom returns the lease an OwnerGuard put in a handler's context.
// Attach its token to every write the handler makes.
func LeaseFrom(ctx context.Context) (*ownership.Lease, bool) {
	c, ok := ctx.Value(guardedCtx{}).(*guardedCall)
	if !ok {
		return nil, false
	}
	return c.lease, true
}

// RoutedKey returns the key the call being served was routed by: the key
// whose lease LeaseFrom returns. A handler whose request names a key of its
// own must serve it only if it equals this one (or set
// GuardConfig.RequestKey), since the lease covers only the routed key's
// partition. The slice must not be changed.
func RoutedKey(ctx context.Context) ([]byte, bool) {
	c, ok := ctx.Value(guardedCtx{}).(*guardedCall)
	if !ok {
		return nil, false
	}
	return c.key, true
}

func (g *OwnerGuard) enter(ctx context.Context) (*guardedCall, error) {
	key, err := transport.KeyFromIncoming(ctx)
	if err != nil {
		return nil, err
	}
	lease, err := g.leases.Lease(key)
	if err != nil {
		return nil, g.refusal(err)
	}
	c := &guardedCall{g: g, parent: ctx, lease: lease, key: key}
	c.ctx, c.cancel = context.WithCancelCause(transport.WithToken(context.WithValue(ctx, guardedCtx{}, c), lease.Token()))
	lctx := lease.Context()
	c.stop = context.AfterFunc(lctx, func() { c.cancel(context.Cause(lctx)) })
	return c, nil
}

// refusal turns the coordinator's answer into the call's status.
func (g *OwnerGuard) refusal(err error) error {
	var no *ownership.NotOwnerError
	if errors.As(err, &no) {
		if no.Owner.Node == g.leases.Self().Name {
			return transport.HandoffStatus(no.Owner.Partition, no.Owner.Node)
		}
		return transport.NotOwnerStatus(no.Owner)
	}
	if st := transport.StatusFromError(err); st != err {
		return st
	}
	return status.Error(codes.Unavailable, err.Error())
}

func (c *guardedCall) exit(err error) error {
	c.stop()
	c.cancel(nil)
	if err == nil {
		return nil
	}
	if transport.IsOutcomeUnknown(err) {
		return transport.StatusFromError(err)
	}
	self := c.g.leases.Self()
	handoff := transport.HandoffStatus(c.lease.Partition(), self.Name)
	if stale, ok := staleOf(err); ok && stale.Token.Owner == self.Name && stale.Token.Incarnation == self.Incarnation {
		c.g.stale.ReportStale(stale)
		return handoff
	}
	if c.parent.Err() == nil {
		if errors.Is(err, ownership.ErrLeaseEnded) || errors.Is(err, coordinator.ErrClosed) {
			return handoff
		}
		if c.lease.Err() != nil && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
			return handoff
		}
	}
	return transport.StatusFromError(err)
}

// staleOf finds a stale-token rejection in err, raw or as a status.
func staleOf(err error) (*ownership.StaleTokenError, bool) {
	var st *ownership.StaleTokenError
	if errors.As(err, &st) {
		return st, true
	}
	return transport.StaleFromStatus(err)
}

// serverStream replaces a stream's context with the guarded one.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
