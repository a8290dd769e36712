package tenuretest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// FakeConfig configures a Fake.
type FakeConfig struct {
	// Name is the node the leases name. Default "fake".
	Name string
	// Partitions bounds the partition numbers. Default 32.
	Partitions int
	// Handler is called as a coordinator calls it. Required.
	Handler coordinator.Handler
	// Fence, when set, is fenced with each new token before Acquire, as
	// Config.Fence is.
	Fence ownership.Fence
}

// Fake grants, moves and revokes leases on one node's Handler directly,
// for unit tests without a cluster. It keeps the coordinator's promises:
// Acquire after the fence; Release exactly once per lease whose Acquire
// succeeded, with the lease still live for a planned move (Move) and
// after it ended for a lost one (Revoke); a lease's end cause wraps
// ownership.ErrLeaseEnded.
type Fake struct {
	cfg    FakeConfig
	inc    uint64
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	leases map[uint32]*ownership.Lease
	epochs map[uint32]uint64
}

// ErrFakeClosed: the Fake was closed.
var ErrFakeClosed = errors.New("tenuretest: fake closed")

// NewFake returns a Fake for cfg.
func NewFake(cfg FakeConfig) (*Fake, error) {
	if cfg.Handler == nil {
		return nil, errors.New("tenuretest: FakeConfig.Handler is nil")
	}
	if cfg.Name == "" {
		cfg.Name = "fake"
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 32
	}
	f := &Fake{cfg: cfg, inc: 1, leases: map[uint32]*ownership.Lease{}, epochs: map[uint32]uint64{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

func (f *Fake) check(p uint32) error {
	if int(p) >= f.cfg.Partitions {
		return fmt.Errorf("tenuretest: partition %d of %d", p, f.cfg.Partitions)
	}
	return f.ctx.Err()
}

// Grant gives this node a new lease on p (the next epoch), fences
// Config.Fence with it and calls Handler.Acquire. It returns the lease,
// or Acquire's error (the lease then ends and Release is not called).
func (f *Fake) Grant(ctx context.Context, p uint32) (*ownership.Lease, error) {
	if err := f.check(p); err != nil {
		return nil, err
	}
	f.mu.Lock()
	if f.leases[p] != nil {
		f.mu.Unlock()
		return nil, fmt.Errorf("tenuretest: partition %d is granted already", p)
	}
	f.epochs[p]++
	tok := ownership.Token{Partition: p, Epoch: f.epochs[p], Owner: f.cfg.Name, Incarnation: f.inc}
	f.mu.Unlock()
	if f.cfg.Fence != nil {
		_, err := f.cfg.Fence.Fence(ctx, tok)
		var stale *ownership.StaleTokenError
		if errors.As(err, &stale) {
			// The resource saw a later epoch: claim above it, as an
			// authority would.
			f.mu.Lock()
			f.epochs[p] = max(f.epochs[p], stale.Current.Epoch)
			f.mu.Unlock()
			return f.Grant(ctx, p)
		}
		if err != nil {
			return nil, err
		}
	}
	lease := ownership.NewLease(f.ctx, tok)
	if err := f.cfg.Handler.Acquire(ctx, lease); err != nil {
		lease.End(fmt.Errorf("%w: acquire failed: %w", ownership.ErrLeaseEnded, err))
		return nil, err
	}
	f.mu.Lock()
	f.leases[p] = lease
	f.mu.Unlock()
	return lease, nil
}

func (f *Fake) take(p uint32) (*ownership.Lease, error) {
	if err := f.check(p); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.leases[p]
	if l == nil {
		return nil, fmt.Errorf("tenuretest: partition %d is not granted", p)
	}
	delete(f.leases, p)
	return l, nil
}

// Move hands p off as a planned move does: Handler.Release drains while
// the lease is live, then the lease ends.
func (f *Fake) Move(ctx context.Context, p uint32) error {
	l, err := f.take(p)
	if err != nil {
		return err
	}
	err = f.cfg.Handler.Release(ctx, l)
	l.End(fmt.Errorf("%w: moved", ownership.ErrLeaseEnded))
	return err
}

// Revoke takes p away as a lost lease is (a step-down, a higher claim): the
// lease ends first, with cause, then Handler.Release is called.
func (f *Fake) Revoke(ctx context.Context, p uint32, cause error) error {
	l, err := f.take(p)
	if err != nil {
		return err
	}
	if cause == nil {
		cause = errors.New("revoked")
	}
	l.End(fmt.Errorf("%w: %w", ownership.ErrLeaseEnded, cause))
	return f.cfg.Handler.Release(ctx, l)
}

// TakeOver plays another node, by, claiming p behind this node's back: it
// fences Config.Fence with a later token of by's, as a new owner on the
// other side of a partition does. This node's lease stays live (it has
// not heard), so its writes now meet the fence; Revoke ends it.
func (f *Fake) TakeOver(ctx context.Context, p uint32, by string) (ownership.Token, error) {
	if err := f.check(p); err != nil {
		return ownership.Token{}, err
	}
	if f.cfg.Fence == nil {
		return ownership.Token{}, errors.New("tenuretest: TakeOver needs FakeConfig.Fence")
	}
	f.mu.Lock()
	f.epochs[p]++
	tok := ownership.Token{Partition: p, Epoch: f.epochs[p], Owner: by, Incarnation: 2}
	f.mu.Unlock()
	_, err := f.cfg.Fence.Fence(ctx, tok)
	return tok, err
}

// Lease returns this node's live lease on p, or nil.
func (f *Fake) Lease(p uint32) *ownership.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leases[p]
}

// Close revokes every lease (Release is called for each) and refuses
// further grants.
func (f *Fake) Close(ctx context.Context) error {
	f.mu.Lock()
	ps := make([]uint32, 0, len(f.leases))
	for p := range f.leases {
		ps = append(ps, p)
	}
	f.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, f.Revoke(ctx, p, ErrFakeClosed))
	}
	f.cancel()
	return errors.Join(errs...)
}
