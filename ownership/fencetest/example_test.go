package fencetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// store is a fenced store of the kind tenure does not ship, written as a
// user would: a map, with each partition's mark beside it (kept without
// its MAC, as a column would keep it, so stale answers sign it again). broken, if
// set, is a defect the suite must find (see TestSuiteFindsDefects).
type store struct {
	keys   *ownership.Keyring // nil: tokens are not authenticated
	broken string

	mu    sync.Mutex
	marks map[uint32]ownership.Token
	data  map[string]string
}

func (s *store) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	if err := s.verify(t); err != nil {
		return ownership.Token{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mark := s.marks[t.Partition]
	if t.Compare(mark) < 0 && s.broken != "fence-falls" {
		return s.sign(mark), ownership.Stale(t, s.sign(mark))
	}
	s.marks[t.Partition] = unsigned(t)
	return t, nil
}

// Do sets key to value if t passes the fence in mode m.
func (s *store) Do(ctx context.Context, t ownership.Token, m ownership.Mode, key, value string) error {
	if err := s.verify(t); err != nil {
		return err
	}
	if m != ownership.Exact && m != ownership.Monotonic {
		return fmt.Errorf("unknown mode %v", m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mark := s.marks[t.Partition]
	if m == ownership.Monotonic && !t.IsZero() && t.Compare(mark) > 0 {
		s.marks[t.Partition], mark = unsigned(t), unsigned(t)
	}
	err := ownership.Judge(t, s.sign(mark))
	if s.broken == "stale-writes" && errors.Is(err, ownership.ErrStaleToken) && !t.IsZero() {
		err = nil
	}
	if err != nil {
		return err
	}
	s.data[key] = value
	return nil
}

func unsigned(t ownership.Token) ownership.Token {
	t.MAC = [ownership.MACSize]byte{}
	return t
}

func (s *store) verify(t ownership.Token) error {
	if s.keys == nil {
		return nil
	}
	return s.keys.Verify(t)
}

func (s *store) sign(mark ownership.Token) ownership.Token {
	if s.keys == nil || mark.IsZero() || s.broken == "unsigned" {
		return mark
	}
	return s.keys.Sign(mark)
}

func newStore(keys *ownership.Keyring) *store {
	return &store{keys: keys, marks: map[uint32]ownership.Token{}, data: map[string]string{}}
}

// subject is the store as the suite sees it: its fence, its marks, and a
// fenced write and a read of one key.
func (s *store) subject() fencetest.Subject {
	return fencetest.Subject{
		Fence: s,
		Current: func(ctx context.Context, p uint32) (ownership.Token, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.marks[p], nil
		},
		Write: s.Do, // (ctx, token, mode, key, value)
		Read: func(ctx context.Context, key string) (string, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.data[key], nil
		},
	}
}

// TestStoreFence checks the store's fence against the contract.
func TestStoreFence(t *testing.T) {
	fencetest.Run(t, fencetest.Config{
		New: func(t testing.TB) fencetest.Subject { return newStore(nil).subject() },
		NewKeyed: func(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
			return newStore(keys).subject()
		},
	})
}
