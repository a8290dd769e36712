package ownership

import (
	"context"
)

// Mode says how a write's token is checked against the partition's
// high-water mark.
type Mode uint8

const (
	// Exact accepts a write only under the token that was fenced last. Use
	// it when every owner fences on acquire (the coordinator's default):
	// any other token, lower or higher, is someone who skipped the fence.
	Exact Mode = iota
	// Monotonic accepts a write under any token not below the mark, and a
	// higher token advances the mark as a fence would. Use it for resources
	// that owners may write without fencing first (for example a downstream
	// service that only sees tokens on writes).
	Monotonic
)

func (m Mode) String() string {
	switch m {
	case Exact:
		return "exact"
	case Monotonic:
		return "monotonic"
	}
	return "mode(?)"
}

// Fence is the resource side of fencing: it keeps, per partition, the
// highest token accepted (the high-water mark).
//
// Implementations are safe for concurrent use and may block (they do I/O).
type Fence interface {
	// Fence advances the partition's mark to t if t is higher and returns
	// the mark as it stands afterwards. If t is lower than the mark, it
	// returns the mark and a *StaleTokenError. Fencing with the current mark
	// again is a no-op that succeeds, so a fence whose answer was lost can
	// be retried.
	Fence(ctx context.Context, t Token) (Token, error)
}

// Judge is the rule every fence applies to a write, without advancing the
// mark: nil if t is the partition's mark; a *StaleTokenError if t is below
// it (or is the zero token); a *NotFencedError (errors.Is ErrNotFenced) if t is above
// it, which in Exact mode means its owner skipped the fence and in
// Monotonic mode means the mark must advance first.
func Judge(t, mark Token) error {
	c := t.Compare(mark)
	switch {
	case t.IsZero() || c < 0:
		return Stale(t, mark)
	case c == 0:
		return nil
	default:
		return &NotFencedError{Token: t, Current: mark, Mark: mark}
	}
}

// A Verifier authenticates a token before a fence acts on it (for example
// a Keyring checking the token's MAC). Verify returns nil for an authentic
// token and an error, which should wrap ErrBadMAC, otherwise. It is called
// concurrently and must not block.
type Verifier interface {
	Verify(t Token) error
}

// A Signer signs the marks a fence reports (for example a Keyring): a
// keyed cluster believes the current token of a stale answer only if it
// carries a valid MAC, and a fence may keep a mark without its MAC. It is
// called concurrently and must not block.
type Signer interface {
	Sign(t Token) Token
}

var (
	_ Verifier = (*Keyring)(nil)
	_ Signer   = (*Keyring)(nil)
)
