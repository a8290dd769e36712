package etcdfence

import (
	"context"
	"errors"
	"fmt"
	"math"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
)

// An Authority mints epochs in etcd, on the fence keys themselves: a
// claim moves partition p's mark to the epoch after the one the claimant
// has seen and makes the claimant its owner, in one transaction that
// compares the mark first, or fails if another claim or fence moved it past
// what the claimant saw. It gives S4: per partition, epochs increase in
// real-time order (etcd's transactions are linearizable), each is held by
// one node, and they are dense (1, 2, 3, ...) as long as the keys are kept.
// A claimant that has seen more than etcd holds (keys restored from a
// backup) claims above what it saw, so no token is issued twice. A successful claim is also a fence: no Do under an older
// token applies anything after Claim returns.
//
// Use it only on a prefix whose marks all come from this authority (Fence
// and Monotonic writes with its tokens are fine); tokens minted elsewhere
// would break density. An Authority is safe for concurrent use and may
// block on etcd.
type Authority struct {
	f *Fence
}

var _ ownership.Authority = (*Authority)(nil)

// Authority returns the authority over f's keys. Tokens it returns are
// not authenticated: if f has a Verifier, sign them before use.
func (f *Fence) Authority() *Authority { return &Authority{f: f} }

// Strict returns true: etcd issues each epoch once (S4).
func (a *Authority) Strict() bool { return true }

// Claim makes n the owner of partition p in epoch seen.Epoch+1, provided
// the partition's mark is not above epoch seen.Epoch (a partition without
// a mark is at epoch 0). Otherwise it returns a *ownership.ConflictError
// carrying p and the mark. seen is normally the mark
// read with Fence.Current or the token of the last claim; only its epoch
// is compared.
func (a *Authority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	if n.Name == "" {
		return ownership.Token{}, errors.New("etcdfence: claim by a node without a name")
	}
	if !seen.IsZero() && seen.Partition != p {
		return ownership.Token{}, fmt.Errorf("etcdfence: claim of p%d with a token of p%d", p, seen.Partition)
	}
	if seen.Epoch == math.MaxUint64 {
		return ownership.Token{}, fmt.Errorf("etcdfence: claim of p%d: epoch %d is the last", p, seen.Epoch)
	}
	next := ownership.Token{Partition: p, Epoch: seen.Epoch + 1, Owner: n.Name, Incarnation: n.Incarnation}
	put, err := encodeMark(next)
	if err != nil {
		return ownership.Token{}, err
	}
	key := a.f.key(p)
	// First try: the mark is seen itself (or there is none).
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	if seen.Epoch > 0 {
		seen.Partition = p
		want, err := encodeMark(seen)
		if err != nil {
			return ownership.Token{}, err
		}
		cmp = clientv3.Compare(clientv3.Value(key), "=", want)
	}
	for range 3 {
		resp, err := a.f.kv.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, put)).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return ownership.Token{}, fmt.Errorf("etcdfence: claim of p%d above epoch %d: %w", p, seen.Epoch, err)
		}
		if resp.Succeeded {
			return next, nil
		}
		cur, rev, err := markOf(p, resp.Responses[0].GetResponseRange().Kvs)
		if err != nil {
			return ownership.Token{}, fmt.Errorf("etcdfence: claim of p%d: %w", p, err)
		}
		if cur.Epoch > seen.Epoch {
			return ownership.Token{}, &ownership.ConflictError{Partition: p, Seen: seen, Current: cur}
		}
		// The mark is not past seen's epoch, but it is not seen itself:
		// seen's epoch under another name, or an earlier epoch (the keys
		// were restored from a backup, or deleted, while gossip remembers
		// later epochs). Claim above seen, comparing the revision of the
		// mark just read.
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", rev)
		if rev == 0 {
			cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		}
	}
	cur, err := a.f.Current(ctx, p)
	if err != nil {
		return ownership.Token{}, fmt.Errorf("etcdfence: claim of p%d above epoch %d: %w; %w", p, seen.Epoch, ownership.ErrConflict, err)
	}
	return ownership.Token{}, &ownership.ConflictError{Partition: p, Seen: seen, Current: cur}
}
