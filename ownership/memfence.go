package ownership

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// MemoryFenceConfig configures a MemoryFence.
type MemoryFenceConfig struct {
	// Partitions is the number of partitions, numbered 0 to Partitions-1.
	// Required: at least 1, at most 2^32. Memory grows linearly (a few
	// dozen bytes per partition).
	Partitions int
	// Keyring, if not nil, makes the fence verify every token's MAC before
	// anything else and reject a bad one with ErrBadMAC. Default nil: tokens
	// are not authenticated, so any client can fence out every owner with a
	// huge epoch. Verifying costs an HMAC (a few hundred nanoseconds) whenever the
	// token is not byte-for-byte the partition's current mark.
	Keyring *Keyring
}

// Validate reports whether c can build a fence.
func (c MemoryFenceConfig) Validate() error {
	if c.Partitions < 1 || uint64(c.Partitions) > math.MaxUint32+1 {
		return fmt.Errorf("ownership: memory fence needs 1 to 2^32 partitions, got %d", c.Partitions)
	}
	return nil
}

// MemoryFence fences a resource that lives in the same process as its
// writers, such as an in-memory shard. It keeps each partition's high-water
// mark in memory: it starts at the zero token and is lost with the process,
// so it protects state that is lost with the process too.
//
// All methods are safe for concurrent use. Check never blocks, except when a
// Monotonic check advances the mark (see Fence); Do and Fence may block.
type MemoryFence struct {
	keys  *Keyring
	parts []memPartition
	zero  *Token // every partition's first mark
}

type memPartition struct {
	mark atomic.Pointer[Token] // never nil; replaced, never mutated
	// mu is held shared by Do while its fn runs and exclusively while the
	// mark advances, so no write under an older token runs once the mark
	// has moved past it.
	mu sync.RWMutex
}

var _ Fence = (*MemoryFence)(nil)

// NewMemoryFence returns a fence for partitions 0 to partitions-1 that does
// not authenticate tokens.
func NewMemoryFence(partitions int) (*MemoryFence, error) {
	return NewMemoryFenceConfig(MemoryFenceConfig{Partitions: partitions})
}

// NewMemoryFenceConfig returns a fence configured by c.
func NewMemoryFenceConfig(c MemoryFenceConfig) (*MemoryFence, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	f := &MemoryFence{keys: c.Keyring, parts: make([]memPartition, c.Partitions), zero: new(Token)}
	for i := range f.parts {
		f.parts[i].mark.Store(f.zero)
	}
	return f, nil
}

// Fence advances t's partition to t if t is higher than its mark, and
// returns the mark. It first waits for every Do of the partition in flight
// to return, so once Fence returns no write under a lower token is running
// or will run (S2: what the new owner reads next is final). A lower token
// gets the mark and a *StaleTokenError.
//
// ctx is checked before waiting; Fence can't abandon the wait, which lasts
// as long as the slowest fn running in Do on the partition.
func (f *MemoryFence) Fence(ctx context.Context, t Token) (Token, error) {
	if err := ctx.Err(); err != nil {
		return Token{}, err
	}
	p, err := f.partition(t)
	if err != nil {
		return Token{}, err
	}
	if err := f.verify(t, p.mark.Load()); err != nil {
		return Token{}, err
	}
	return p.advance(t)
}

// Check reports whether a write under t may proceed now:
//   - nil if t is the partition's mark (either mode) or, in Monotonic mode,
//     above it, in which case t becomes the mark as if fenced;
//   - a *StaleTokenError (ErrStaleToken) carrying the mark if t is below it,
//     or t is the zero token;
//   - an error wrapping ErrNotFenced if t is above the mark in Exact mode;
//   - ErrPartitionRange, or ErrBadMAC if the fence has a Keyring.
//
// The check and the write that follows are not atomic: the mark may move in
// between. Use Do when the write must not run after a newer owner fenced.
func (f *MemoryFence) Check(t Token, m Mode) error {
	// Fast path: an unauthenticated fence and t is the mark.
	if f.keys == nil && int64(t.Partition) < int64(len(f.parts)) {
		cur := f.parts[t.Partition].mark.Load()
		if t.Epoch == cur.Epoch && t.Incarnation == cur.Incarnation && t.Owner == cur.Owner &&
			cur != f.zero && m <= Monotonic {
			return nil
		}
	}
	return f.check(t, m)
}

// check is Check without the fast path.
func (f *MemoryFence) check(t Token, m Mode) error {
	if m > Monotonic {
		return fmt.Errorf("ownership: unknown fence mode %d", m)
	}
	p, err := f.partition(t)
	if err != nil {
		return err
	}
	cur := p.mark.Load()
	if err := f.verify(t, cur); err != nil {
		return err
	}
	if m == Monotonic && t.Compare(*cur) > 0 {
		_, err := p.advance(t)
		return err
	}
	return Judge(t, *cur)
}

// Do runs fn if t passes Check in mode m, and keeps the partition's mark
// from moving until fn returns: no Fence of the partition completes while
// fn runs. It returns Check's error without running fn, or fn's error. A
// nil fn is an error. Do checks ctx before waiting and does not pass it to
// fn: fn closes over the context it needs.
//
// fn must be short (a Fence of the partition waits for it) and must not
// call the fence for the same partition: a Fence or a Monotonic advance
// from inside fn deadlocks.
func (f *MemoryFence) Do(ctx context.Context, t Token, m Mode, fn func() error) error {
	if fn == nil {
		return errors.New("ownership: MemoryFence.Do with a nil fn")
	}
	if m > Monotonic {
		return fmt.Errorf("ownership: unknown fence mode %d", m)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := f.partition(t)
	if err != nil {
		return err
	}
	if err := f.verify(t, p.mark.Load()); err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if m == Monotonic && t.Compare(*p.mark.Load()) > 0 {
		// Advancing needs the partition to itself.
		p.mu.RUnlock()
		_, err := p.advance(t)
		p.mu.RLock()
		if err != nil {
			return err
		}
	}
	if err := Judge(t, *p.mark.Load()); err != nil {
		return err
	}
	return fn()
}

// Current returns partition p's mark: the zero token until the partition
// is first fenced, and for a p out of range.
func (f *MemoryFence) Current(p uint32) Token {
	if int64(p) >= int64(len(f.parts)) {
		return Token{}
	}
	return *f.parts[p].mark.Load()
}

// Partitions returns the number of partitions the fence was built for.
func (f *MemoryFence) Partitions() int { return len(f.parts) }

func (f *MemoryFence) partition(t Token) (*memPartition, error) {
	if int64(t.Partition) >= int64(len(f.parts)) {
		return nil, fmt.Errorf("%w: partition %d, fence has %d", ErrPartitionRange, t.Partition, len(f.parts))
	}
	return &f.parts[t.Partition], nil
}

// verify checks t's MAC. A token identical to the mark, MAC included, was
// verified when it became the mark.
func (f *MemoryFence) verify(t Token, mark *Token) error {
	if f.keys == nil {
		return nil
	}
	if t.Compare(*mark) == 0 && !mark.IsZero() &&
		subtle.ConstantTimeCompare(t.MAC[:], mark.MAC[:]) == 1 {
		return nil
	}
	return f.keys.Verify(t)
}

// advance makes t the mark if it is higher, once no Do is running, and
// returns the mark; a lower t gets the mark and a *StaleTokenError.
func (p *memPartition) advance(t Token) (Token, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.mark.Load()
	switch c := t.Compare(*cur); {
	case c > 0:
		p.mark.Store(&t)
		return t, nil
	case c == 0:
		return *cur, nil
	default:
		return *cur, Stale(t, *cur)
	}
}
