package ownership

import "context"

// A Lease is this node's grant of one partition: its token and a context
// that is cancelled the moment the lease ends (released, revoked, fenced out,
// or the node lost its quorum).
//
// Cancellation is advisory: a paused process can't see it in time. Safety
// comes from the token, which the resource checks on every write; pass
// Token to every fenced write and Context to every call made for the
// partition.
//
// A Lease is safe for concurrent use.
type Lease struct {
	token  Token
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// NewLease returns a live lease for t whose context derives from parent.
// The coordinator makes leases; tests and other shells may too.
func NewLease(parent context.Context, t Token) *Lease {
	ctx, cancel := context.WithCancelCause(parent)
	return &Lease{token: t, ctx: ctx, cancel: cancel}
}

// Partition returns the leased partition.
func (l *Lease) Partition() uint32 { return l.token.Partition }

// Token returns the fencing token to attach to every write.
func (l *Lease) Token() Token { return l.token }

// Context returns a context cancelled when the lease ends; its cause
// (context.Cause) wraps ErrLeaseEnded.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is Context().Done().
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is live and the cause of its end after.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// End ends the lease with cause (which should wrap ErrLeaseEnded); it is
// idempotent. The shell calls it; a handler may call it to give up early.
func (l *Lease) End(cause error) {
	if cause == nil {
		cause = ErrLeaseEnded
	}
	l.cancel(cause)
}

func (l *Lease) String() string { return "lease " + l.token.String() }
