package transport

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
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

// staleReporter is the optional part of Leases: the coordinator's
// ReportStale, called when a handler's write was fenced out.
type staleReporter interface {
	ReportStale(err error) bool
}

// GuardConfig configures an OwnerGuard.
type GuardConfig struct {
	// Leases answers which partitions this node owns. Required: the node's
	// *coordinator.Coordinator.
	Leases Leases
	// Exempt reports whether a method (its full name, "/pkg.Service/Method")
	// is served without a key and without an ownership check. Default
	// DefaultExempt: the health, reflection and ownership services. A
	// function of your own should exempt those too (call DefaultExempt).
	Exempt func(fullMethod string) bool
}

// Validate reports whether c can build a guard. It does not change c.
func (c GuardConfig) Validate() error {
	if c.Leases == nil {
		return errors.New("transport: GuardConfig.Leases is nil")
	}
	return nil
}

// DefaultExempt exempts gRPC's health and reflection services and tenure's
// ownership service: they answer for the node, not for a key.
func DefaultExempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.") ||
		strings.HasPrefix(fullMethod, "/tenure.ownership.v1.Ownership/")
}

// An OwnerGuard lets through only the calls whose key this node owns. Its
// interceptors read the key from the call's metadata (KeyMetadata), and:
//
//   - when the node holds the partition's lease, run the handler with a
//     context that carries the lease (LeaseFrom) and that is cancelled when
//     the lease ends;
//   - when another node owns it, answer FailedPrecondition with a
//     ReasonNotOwner detail naming the owner, its address and epoch;
//   - when the ring gives the partition to this node but it holds no lease
//     yet (a handoff), answer Unavailable with a ReasonHandoff detail;
//   - when the key is missing, empty, repeated or too long, answer
//     InvalidArgument.
//
// A handler's error is converted with StatusFromError. Two handler errors
// become a ReasonHandoff Unavailable, so the client retries at the next
// owner: a cancellation caused by the lease ending, and a
// *ownership.StaleTokenError for this node's own token, which is also passed
// to the coordinator's ReportStale. Both mean the handler may have run in
// part: make handlers idempotent or fence every write.
//
// An OwnerGuard is safe for concurrent use.
type OwnerGuard struct {
	leases Leases
	stale  staleReporter
	exempt func(string) bool
}

// NewGuard returns a guard for cfg.
func NewGuard(cfg GuardConfig) (*OwnerGuard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &OwnerGuard{leases: cfg.Leases, exempt: cfg.Exempt}
	if g.exempt == nil {
		g.exempt = DefaultExempt
	}
	g.stale, _ = cfg.Leases.(staleReporter)
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
			return nil, err
		}
		resp, err := handler(call.ctx, req)
		return resp, call.exit(err)
	}
}

// Stream returns the guard's stream server interceptor.
func (g *OwnerGuard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if g.exempt(info.FullMethod) {
			return handler(srv, ss)
		}
		call, err := g.enter(ss.Context())
		if err != nil {
			return err
		}
		return call.exit(handler(srv, &serverStream{ServerStream: ss, ctx: call.ctx}))
	}
}

type leaseCtx struct{}

// LeaseFrom returns the lease an OwnerGuard put in a handler's context.
// Attach its token to every write the handler makes.
func LeaseFrom(ctx context.Context) (*ownership.Lease, bool) {
	l, ok := ctx.Value(leaseCtx{}).(*ownership.Lease)
	return l, ok
}

// guardedCall is one call let through by the guard.
type guardedCall struct {
	g      *OwnerGuard
	parent context.Context
	ctx    context.Context
	lease  *ownership.Lease
	cancel context.CancelCauseFunc
	stop   func() bool
}

func (g *OwnerGuard) enter(ctx context.Context) (*guardedCall, error) {
	key, err := decodeKey(metadata.ValueFromIncomingContext(ctx, KeyMetadata))
	if err != nil {
		return nil, err
	}
	lease, err := g.leases.Lease(key)
	if err != nil {
		return nil, g.refusal(err)
	}
	c := &guardedCall{g: g, parent: ctx, lease: lease}
	c.ctx, c.cancel = context.WithCancelCause(context.WithValue(ctx, leaseCtx{}, lease))
	lctx := lease.Context()
	c.stop = context.AfterFunc(lctx, func() { c.cancel(context.Cause(lctx)) })
	return c, nil
}

// refusal turns the coordinator's answer into the call's status.
func (g *OwnerGuard) refusal(err error) error {
	var no *ownership.NotOwnerError
	if errors.As(err, &no) {
		if no.Owner.Node == g.leases.Self().Name {
			return handoffStatus(no.Owner.Partition, no.Owner.Node)
		}
		return NotOwnerStatus(no.Owner)
	}
	if st := StatusFromError(err); st != err {
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
	self := c.g.leases.Self()
	if c.lease.Err() != nil && c.parent.Err() == nil &&
		(errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
		return handoffStatus(c.lease.Partition(), self.Name)
	}
	stale, ok := staleOf(err)
	if ok && stale.Token.Owner == self.Name && stale.Token.Incarnation == self.Incarnation {
		if c.g.stale != nil {
			c.g.stale.ReportStale(stale)
		}
		return handoffStatus(c.lease.Partition(), self.Name)
	}
	return StatusFromError(err)
}

// staleOf finds a stale-token rejection in err, raw or as a status.
func staleOf(err error) (*ownership.StaleTokenError, bool) {
	var st *ownership.StaleTokenError
	if errors.As(err, &st) {
		return st, true
	}
	return StaleFromStatus(err)
}

// serverStream replaces a stream's context with the guarded one.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
