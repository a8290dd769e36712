// Package gate is the per-partition gate a coordinator.Handler puts in
// front of its writes, so that a planned move (a graceful Leave, a join)
// rejects none of them: Acquire opens the partition's gate under the new
// lease, every write enters and exits it, and Release closes it and waits
// for the writes in flight (the drain) before the release is published and
// the next owner fences.
//
// The caller's duties, in order:
//
//  1. Build one Gate per node for the coordinator's partition count
//     (Coordinator.Config().Ring.Partitions).
//  2. In Handler.Acquire, after the coordinator has fenced the resource,
//     call Open with the lease.
//  3. Around every write of a partition: Enter with the lease the write
//     runs under, the write (with the lease's token: the gate drains, the
//     fence is what refuses a stale write), then Exit. An Enter error wraps
//     ownership.ErrLeaseEnded: the partition is not open under that lease
//     (not acquired yet, being released, or the lease ended), nothing was
//     written, and a routed caller retries at the next owner
//     (routing.OwnerGuard answers it as a handoff).
//  4. In Handler.Release, call Close with the lease: it returns once the
//     writes in flight under it have exited, or ctx ends. The coordinator
//     calls Release for every lease end, also after a lease was lost; Close
//     accepts a lease that ended, or one the gate was never opened for.
package gate

import (
	"context"
	"fmt"
	"sync"

	"github.com/tenure-go/tenure/ownership"
)

// A Gate holds, per partition, the lease writes may enter under and the
// writes in flight. It is safe for concurrent use.
type Gate struct {
	parts []part
}

type part struct {
	mu       sync.Mutex
	lease    *ownership.Lease // open under this lease; nil: closed
	inflight int              // writes entered and not exited, under any lease
	drained  chan struct{}    // closed when inflight drops to 0; nil if no one waits
}

// New returns a gate for partitions 0 to partitions-1, every one closed.
func New(partitions int) *Gate {
	return &Gate{parts: make([]part, max(partitions, 0))}
}

func (g *Gate) part(p uint32) (*part, error) {
	if int64(p) >= int64(len(g.parts)) {
		return nil, fmt.Errorf("gate: partition %d: %w", p, ownership.ErrPartitionRange)
	}
	return &g.parts[p], nil
}

// Open opens l's partition to writes under l, replacing any lease it was
// open under.
func (g *Gate) Open(l *ownership.Lease) error {
	pt, err := g.part(l.Partition())
	if err != nil {
		return err
	}
	pt.mu.Lock()
	pt.lease = l
	pt.mu.Unlock()
	return nil
}

// Enter admits one write under l. It fails, with an error wrapping
// ownership.ErrLeaseEnded, when l's partition is not open under l or l has
// ended. Every nil return must be matched by one Exit.
func (g *Gate) Enter(l *ownership.Lease) error {
	pt, err := g.part(l.Partition())
	if err != nil {
		return err
	}
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.lease != l || l.Err() != nil {
		return fmt.Errorf("gate: partition %d is not open under %v: %w", l.Partition(), l.Token(), ownership.ErrLeaseEnded)
	}
	pt.inflight++
	return nil
}

// Exit ends a write that Enter admitted under l.
func (g *Gate) Exit(l *ownership.Lease) {
	pt, err := g.part(l.Partition())
	if err != nil {
		return
	}
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.inflight == 0 {
		return // an Exit without its Enter: a bug of the caller's, harmless here
	}
	pt.inflight--
	if pt.inflight == 0 && pt.drained != nil {
		close(pt.drained)
		pt.drained = nil
	}
}

// Close closes l's partition if it is open under l, so no further write
// enters under l, and waits until the writes in flight have exited or ctx
// ends (then it returns ctx's error). A lease that ended, or that the
// partition is not open under (a late Release after a newer Open), closes
// nothing; Close still waits for the writes in flight.
func (g *Gate) Close(ctx context.Context, l *ownership.Lease) error {
	pt, err := g.part(l.Partition())
	if err != nil {
		return err
	}
	pt.mu.Lock()
	if pt.lease == l {
		pt.lease = nil
	}
	if pt.inflight == 0 {
		pt.mu.Unlock()
		return nil
	}
	if pt.drained == nil {
		pt.drained = make(chan struct{})
	}
	drained := pt.drained
	pt.mu.Unlock()
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gate: partition %d: writes still in flight: %w", l.Partition(), ctx.Err())
	}
}

// IsOpen reports whether l's partition is open under l (and l is live).
func (g *Gate) IsOpen(l *ownership.Lease) bool {
	pt, err := g.part(l.Partition())
	if err != nil {
		return false
	}
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.lease == l && l.Err() == nil
}
