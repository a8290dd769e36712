package ownership

import "context"

// An Authority mints tokens: it decides the epoch a new owner of a partition
// takes.
//
// Implementations are safe for concurrent use and may block.
type Authority interface {
	// Claim mints a token for partition p held by n. The token's epoch is
	// strictly above seen's and above every epoch the authority knows for p.
	// An authority that issues epochs strictly (S4, such as the SQL
	// authority) returns an error wrapping ErrConflict when another claim
	// won the race; the caller may retry.
	Claim(ctx context.Context, p uint32, n Node, seen Token) (Token, error)
	// Strict reports whether the authority issues epochs strictly (S4):
	// per partition, one holder per epoch, in real-time order, so a token
	// it has just minted is the partition's truth even where gossip shows
	// a higher one (left over from a fence table that was reset or
	// restored). A gossip authority is not strict.
	Strict() bool
}
