package coordinator

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tenure-go/tenure/ownership"
)

// errLeaseClosed is the cause of the leases that Close ends: it wraps both
// ownership.ErrLeaseEnded and ErrClosed.
var errLeaseClosed = fmt.Errorf("%w: %w", ownership.ErrLeaseEnded, ErrClosed)

// leaseEntry is one lease this node made, from the action that started it
// (ActFence or ActAcquire) until it has ended and no worker uses it.
type leaseEntry struct {
	lease   *ownership.Lease
	ended   bool // ended by the loop (ActEnd or shutdown)
	workers int  // fence, Acquire and Release calls running with it
	stop    func() bool
}

// registry is the one record of this node's leases. The loop owns it: only
// the loop goroutine calls its methods. Readers on other goroutines see
// only served, the lease per partition that callers may have.
type registry struct {
	entries map[ownership.Token]*leaseEntry
	dead    map[ownership.Token]*leaseEntry // ended: gc forgets them once idle
	served  []atomic.Pointer[ownership.Lease]
	// ended receives the token of a lease whose context ended without the
	// loop ending it (a handler called Lease.End).
	ended func(ownership.Token)
}

func newRegistry(partitions int, ended func(ownership.Token)) *registry {
	return &registry{
		entries: make(map[ownership.Token]*leaseEntry),
		dead:    make(map[ownership.Token]*leaseEntry),
		served:  make([]atomic.Pointer[ownership.Lease], partitions),
		ended:   ended,
	}
}

// key drops the MAC: an entry is named by its grant.
func key(t ownership.Token) ownership.Token {
	t.MAC = [ownership.MACSize]byte{}
	return t
}

// start returns the lease of t, making it if this is its first action.
func (r *registry) start(t ownership.Token) *leaseEntry {
	if e := r.entries[key(t)]; e != nil {
		return e
	}
	e := &leaseEntry{lease: ownership.NewLease(context.Background(), t)}
	e.stop = context.AfterFunc(e.lease.Context(), func() { r.ended(t) })
	r.entries[key(t)] = e
	return e
}

// get returns the entry of t, or nil.
func (r *registry) get(t ownership.Token) *leaseEntry { return r.entries[key(t)] }

// serve lets callers have the lease of t.
func (r *registry) serve(t ownership.Token) *ownership.Lease {
	e := r.get(t)
	if e == nil || e.ended {
		return nil
	}
	r.served[t.Partition].Store(e.lease)
	return e.lease
}

// unserve stops giving the lease of t to new callers.
func (r *registry) unserve(t ownership.Token) {
	if e := r.get(t); e != nil {
		r.served[t.Partition].CompareAndSwap(e.lease, nil)
	}
}

// end ends the lease of t with cause and reports whether it was live.
func (r *registry) end(t ownership.Token, cause error) bool {
	e := r.get(t)
	if e == nil || e.ended {
		return false
	}
	r.unserve(t)
	r.markEnded(t, e)
	e.stop()
	e.lease.End(cause)
	return true
}

// markEnded records that the lease of t has ended.
func (r *registry) markEnded(t ownership.Token, e *leaseEntry) {
	e.ended = true
	r.dead[key(t)] = e
}

// gc forgets the entries that ended and that no worker uses any more.
func (r *registry) gc() {
	for k, e := range r.dead {
		if e.workers == 0 {
			delete(r.entries, k)
			delete(r.dead, k)
		}
	}
}

// lookup returns the lease callers may have for partition p, or nil.
func (r *registry) lookup(p uint32) *ownership.Lease {
	if int(p) >= len(r.served) {
		return nil
	}
	if l := r.served[p].Load(); l != nil && l.Err() == nil {
		return l
	}
	return nil
}
