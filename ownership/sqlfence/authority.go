package sqlfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/tenure-go/tenure/ownership"
)

// An Authority mints epochs from the fence table itself, with a conditional
// upsert: a claim moves partition p's mark to the epoch after the one the
// claimant has seen and makes the claimant its owner, provided the mark is
// not already past what the claimant saw; otherwise it fails, because
// another claim or fence moved it first. It gives S4: per partition, epochs
// increase in real-time order and each is held by one node, and they are
// dense (1, 2, 3, ...) as long as the table keeps its rows. A successful
// claim is also a fence: the new token is the mark, so no write under an
// older token commits after Claim returns.
//
// When the claimant has seen more than the table holds (the table was
// reset or restored from a backup, and gossip remembers later epochs), the
// claim jumps to the epoch after the one seen. So a token is never issued
// twice, even across a reset: a restored table would otherwise hand a node
// the very token it held before the reset.
//
// Use it only on a table whose marks all come from this authority (Fence
// and Monotonic writes with its tokens are fine). An Authority is safe for
// concurrent use and may block on the database.
type Authority struct {
	f *Fence
}

var _ ownership.Authority = (*Authority)(nil)

// Authority returns the authority over f's table. Tokens it returns are not
// authenticated: if f has a Verifier, sign them before use.
func (f *Fence) Authority() *Authority { return &Authority{f: f} }

// Strict returns true: the database issues each epoch once (S4).
func (a *Authority) Strict() bool { return true }

// ConflictError is returned by Claim when the partition's mark is not the
// one the claimant saw: another claim (or a fence) won. Retry with Current
// as seen. errors.Is(err, ownership.ErrConflict) holds.
type ConflictError = ownership.ConflictError

// Claim makes n the owner of partition p in epoch seen.Epoch+1, provided
// the partition's mark is not above seen.Epoch (a partition without a row
// has mark 0). Otherwise it returns a *ConflictError carrying the mark: claim
// again above it. seen is normally the highest token the claimant knows;
// only its epoch is compared.
func (a *Authority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	if n.Name == "" {
		return ownership.Token{}, errors.New("sqlfence: claim by a node without a name")
	}
	if err := checkName(n.Name); err != nil {
		return ownership.Token{}, err
	}
	if !seen.IsZero() && seen.Partition != p {
		return ownership.Token{}, fmt.Errorf("sqlfence: claim of p%d with a token of p%d", p, seen.Partition)
	}
	if seen.Epoch >= math.MaxInt64 {
		return ownership.Token{}, fmt.Errorf("sqlfence: claim of p%d: epoch %d is the last", p, seen.Epoch)
	}
	inc := incarnationText(n.Incarnation)
	var epoch int64
	var err error
	if a.f.d.upsertTwice {
		epoch, err = a.claimCounted(ctx, p, n.Name, inc, seen)
	} else {
		err = a.f.db.QueryRowContext(ctx, a.f.sql.claim, int64(p), n.Name, inc, int64(seen.Epoch)).Scan(&epoch)
	}
	switch {
	case err == nil:
		if uint64(epoch) != seen.Epoch+1 {
			return ownership.Token{}, fmt.Errorf("sqlfence: claim of p%d above epoch %d returned epoch %d", p, seen.Epoch, epoch)
		}
		return ownership.Token{Partition: p, Epoch: uint64(epoch), Owner: n.Name, Incarnation: n.Incarnation}, nil
	case !errors.Is(err, sql.ErrNoRows):
		return ownership.Token{}, fmt.Errorf("sqlfence: claim of p%d above epoch %d: %w", p, seen.Epoch, err)
	}
	cur, err := a.f.Current(ctx, p)
	if err != nil {
		return ownership.Token{}, fmt.Errorf("sqlfence: claim of p%d above epoch %d: %w; %w", p, seen.Epoch, ownership.ErrConflict, err)
	}
	return ownership.Token{}, &ConflictError{Partition: p, Seen: seen, Current: cur}
}
