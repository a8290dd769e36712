package faultctl

import (
	"context"
	"sync"
	"time"
)

// This file is the machinery of Control.Hold and Control.Release: a pause of one
// write at the worst moment, after the node has taken the lease's token and
// passed the partition's gate, before it sends the write to the database.
// A demo or test holds a write there, lets the partition move (pause the
// node, cut it off), releases it, and watches the fence reject it.

// holdSet is the partitions whose next write waits, and the writes
// waiting. It is safe for concurrent use.
type holdSet struct {
	mu     sync.Mutex
	holds  map[uint32]*hold
	closed chan struct{} // closed when the node stops: held writes go on
	once   sync.Once
}

type hold struct {
	waiting bool          // a write is waiting at the hold
	release chan struct{} // closed by Release
}

func newHoldSet() *holdSet { return &holdSet{holds: map[uint32]*hold{}, closed: make(chan struct{})} }

// close lets every held write go on, for good.
func (s *holdSet) close() { s.once.Do(func() { close(s.closed) }) }

// arm makes the next write to partition p wait until release.
func (s *holdSet) arm(p uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.holds[p]; !ok {
		s.holds[p] = &hold{release: make(chan struct{})}
	}
}

// wait blocks a write to partition p at an armed hold until it is released
// or the node stops; a hold stops one write only. A held write models a
// node paused with its write already on the way to the database, past
// every check of its context: the write goes on under a context that the
// call's (and so the lease's) end no longer cancels, bounded by
// heldWriteTimeout. wait returns the context the write must use.
func (s *holdSet) wait(ctx context.Context, p uint32) (context.Context, context.CancelFunc) {
	s.mu.Lock()
	h, ok := s.holds[p]
	if !ok || h.waiting {
		s.mu.Unlock()
		return ctx, func() {}
	}
	h.waiting = true
	s.mu.Unlock()
	select {
	case <-h.release:
	case <-s.closed:
	}
	return context.WithTimeout(context.WithoutCancel(ctx), heldWriteTimeout)
}

// heldWriteTimeout bounds a write after its hold is released.
const heldWriteTimeout = 10 * time.Second

// waiting reports whether a write waits at partition p's hold.
func (s *holdSet) waiting(p uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.holds[p]
	return ok && h.waiting
}

// release lets partition p's held write (if any) go on and disarms the hold.
func (s *holdSet) release(p uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.holds[p]; ok {
		close(h.release)
		delete(s.holds, p)
	}
}
