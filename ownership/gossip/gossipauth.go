package gossip

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// Authority is the embedded Authority: it mints epochs from a gossip
// Register, with no external system. A claim's epoch is one above both the
// highest epoch the register knows for the partition and the epoch of the
// token the caller has seen. The caller passes as seen the highest token it
// knows of, and after a fence rejected its claim as stale, the fence's mark
// (which StaleTokenError carries), so the epoch it takes next is
//
//	max(epoch seen by gossip, fence high-water mark) + 1.
//
// Gossip is eventually consistent: two nodes with split views can mint the
// same epoch. Their tokens still differ (the owner is part of a token and
// orders it), and the fence keeps only the higher one (S1, S3); strict
// issuance (S4) needs a strong authority.
//
// A Authority is safe for concurrent use and never blocks.
type Authority struct {
	reg  *Register
	keys *ownership.Keyring
}

var _ ownership.Authority = (*Authority)(nil)

// NewAuthority returns an authority that mints from r and records what
// it mints there; the caller gossips r. keys, if not nil, signs every token
// minted.
func NewAuthority(r *Register, keys *ownership.Keyring) (*Authority, error) {
	if r == nil {
		return nil, errors.New("gossip: gossip authority needs a register")
	}
	return &Authority{reg: r, keys: keys}, nil
}

// Strict returns false: two nodes with split views can mint the same epoch.
func (a *Authority) Strict() bool { return false }

// Claim mints a token of partition p for n, records it in the register and
// returns it; the caller broadcasts it as a Claim. seen is the zero token or
// a token of partition p. Concurrent claims on one authority get distinct
// epochs. It fails if ctx is done, for p out of range (ErrPartitionRange),
// and for an empty name or one longer than MaxOwnerSize.
func (a *Authority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	if err := ctx.Err(); err != nil {
		return ownership.Token{}, err
	}
	if n.Name == "" || len(n.Name) > ownership.MaxOwnerSize {
		return ownership.Token{}, fmt.Errorf("gossip: node name must be 1 to %d bytes, got %d", ownership.MaxOwnerSize, len(n.Name))
	}
	if !seen.IsZero() && seen.Partition != p {
		return ownership.Token{}, fmt.Errorf("gossip: claiming partition %d with a token of partition %d seen", p, seen.Partition)
	}
	return a.reg.mint(p, seen.Epoch, n, a.keys.Sign)
}
