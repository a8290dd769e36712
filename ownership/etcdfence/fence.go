package etcdfence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// DefaultPrefix is the prefix of the fence keys when Config.Prefix is
// empty.
const DefaultPrefix = "tenure/fence/"

// maxRounds bounds the compare-and-swap rounds of one call: each lost
// round saw the mark move up, which a call can't outlast forever.
const maxRounds = 64

// Verifier is ownership.Verifier.
//
// Deprecated: use ownership.Verifier, which every fence shares.
type Verifier = ownership.Verifier

// Signer is ownership.Signer.
//
// Deprecated: use ownership.Signer, which every fence shares.
type Signer = ownership.Signer

// Config configures a Fence. The zero Config is valid.
type Config struct {
	// Prefix is put before every fence key: partition p's mark is at
	// Prefix + "p/" + p. Default DefaultPrefix ("tenure/fence/"). Give each
	// set of partitions its own prefix; nothing but this package may write
	// under it, and Do refuses ops that would.
	Prefix string
	// Verifier, if set, authenticates every token given to Fence and Do
	// and rejects the call when it fails. Default nil: tokens are not
	// authenticated, so any client that can reach etcd can fence out the
	// owners with a large epoch.
	Verifier ownership.Verifier
	// Signer, if set, signs the mark of every stale answer (the Current
	// of a *ownership.StaleTokenError, and the mark Fence returns with
	// it). Set it, with Verifier, to the cluster's token keyring when the
	// coordinators have Config.TokenKeys: they don't believe an unsigned
	// current token, so without it a node fenced out here learns the mark
	// only from gossip, claiming again after a backoff meanwhile. Signing
	// vouches for the mark: set Verifier too, so that every mark was
	// authentic when it was fenced. Default nil: marks are reported
	// unsigned.
	Signer ownership.Signer
}

// Validate reports whether c is usable. It does not modify c.
func (c Config) Validate() error {
	if strings.IndexByte(c.Prefix, 0) >= 0 {
		return errors.New("etcdfence: prefix holds a NUL byte")
	}
	return nil
}

// A Fence is the resource side of fencing for data kept in etcd: one key
// per partition holding the highest token fenced (the mark), and
// transactions whose operations apply only while their token is the mark.
// It implements ownership.Fence.
//
// A Fence is safe for concurrent use; every method may block on etcd.
type Fence struct {
	kv     clientv3.KV
	prefix string
	verify ownership.Verifier
	sign   ownership.Signer
}

var _ ownership.Fence = (*Fence)(nil)

// New returns a fence whose marks live in kv (a *clientv3.Client, or a
// namespaced KV). It does not touch etcd. The caller keeps ownership of
// the client and closes it after the last call.
func New(kv clientv3.KV, cfg Config) (*Fence, error) {
	if kv == nil {
		return nil, errors.New("etcdfence: nil KV")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Fence{kv: kv, prefix: cfg.Prefix, verify: cfg.Verifier, sign: cfg.Signer}, nil
}

// Prefix returns the prefix of the fence keys.
func (f *Fence) Prefix() string { return f.prefix }

// Fence advances t's partition's mark to t if t is higher and returns the
// mark as it stands afterwards. If t is lower than the mark it returns the
// mark and a *ownership.StaleTokenError. Fencing with the mark again
// succeeds, so a fence whose answer was lost can be retried. Once Fence
// returns, no Do under a lower token applies anything: what the new owner
// reads from etcd next is final.
func (f *Fence) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	if err := f.check(t); err != nil {
		return ownership.Token{}, err
	}
	want, err := encodeMark(t)
	if err != nil {
		return ownership.Token{}, err
	}
	key := f.key(t.Partition)
	resp, err := f.kv.Get(ctx, key)
	if err != nil {
		return ownership.Token{}, fmt.Errorf("etcdfence: fence %v: %w", t, err)
	}
	kvs := resp.Kvs
	for range maxRounds {
		mark, rev, err := markOf(t.Partition, kvs)
		if err != nil {
			return ownership.Token{}, err
		}
		switch c := t.Compare(mark); {
		case c < 0:
			mark = f.signed(mark)
			return mark, ownership.Stale(t, mark)
		case c == 0:
			return t, nil // t is the mark, and keeps its MAC
		}
		txn, err := f.kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, want)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return ownership.Token{}, fmt.Errorf("etcdfence: fence %v: %w", t, err)
		}
		if txn.Succeeded {
			return t, nil
		}
		kvs = txn.Responses[0].GetResponseRange().Kvs
	}
	return ownership.Token{}, fmt.Errorf("etcdfence: fence %v: the mark moved %d times during the call", t, maxRounds)
}

// Current returns partition p's mark, or the zero token (of partition p)
// if p has never been fenced. The mark may have moved by the time it
// returns.
func (f *Fence) Current(ctx context.Context, p uint32) (ownership.Token, error) {
	resp, err := f.kv.Get(ctx, f.key(p))
	if err != nil {
		return ownership.Token{}, fmt.Errorf("etcdfence: read mark of p%d: %w", p, err)
	}
	mark, _, err := markOf(p, resp.Kvs)
	return mark, err
}

// Do runs ops in one etcd transaction that applies them only if t is
// current for its partition under mode m, so the check and the ops apply
// or fail together:
//
//   - Exact: t must equal the mark. A lower t fails with a
//     *ownership.StaleTokenError carrying the mark; a higher one (never
//     fenced) with an error wrapping ownership.ErrNotFenced: fence, then
//     retry.
//   - Monotonic: t must not be below the mark; a higher t becomes the mark
//     in the same transaction, as a fence would.
//
// On success it returns etcd's answer, whose Responses are the answers to
// ops, in order. Reads among ops see the state under the fence; for
// conditions of your own, pass a clientv3.OpTxn (its Succeeded tells
// whether your compares held). Ops may not write under the fence prefix.
// The transaction counts against etcd's limit on operations per
// transaction (--max-txn-ops, 128 by default) with one more operation.
//
// An error from etcd after the request was sent leaves the outcome
// unknown: it wraps ownership.ErrOutcomeUnknown (and no context error),
// except for answers that say the request was refused as invalid.
func (f *Fence) Do(ctx context.Context, t ownership.Token, m ownership.Mode, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := f.check(t); err != nil {
		return nil, err
	}
	if m != ownership.Exact && m != ownership.Monotonic {
		return nil, fmt.Errorf("etcdfence: unknown mode %d", m)
	}
	if err := f.checkOps(ops); err != nil {
		return nil, err
	}
	want, err := encodeMark(t)
	if err != nil {
		return nil, err
	}
	key := f.key(t.Partition)
	byValue := clientv3.Compare(clientv3.Value(key), "=", want)
	cmp, then := byValue, ops
	for range maxRounds {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("etcdfence: not applied under %v: %w", t, err)
		}
		resp, err := f.kv.Txn(ctx).If(cmp).Then(then...).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return nil, sendError(t, err)
		}
		if resp.Succeeded {
			resp.Responses = resp.Responses[len(then)-len(ops):] // the caller's answers only
			return resp, nil
		}
		mark, rev, err := markOf(t.Partition, resp.Responses[0].GetResponseRange().Kvs)
		if err != nil {
			return nil, err
		}
		switch c := t.Compare(mark); {
		case c == 0 && len(then) > len(ops):
			// Another write under t raised the mark first: check by value.
			cmp, then = byValue, ops
			continue
		case c == 0:
			return nil, fmt.Errorf("%w of p%d: it decodes to %v but is not its encoding", errCorrupt, t.Partition, mark)
		case m == ownership.Exact || c < 0:
			return nil, ownership.Judge(t, f.signed(mark))
		}
		// Monotonic, and t is above the mark: raise it in the same
		// transaction, if the mark has not moved since it was read.
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", rev)
		then = append([]clientv3.Op{clientv3.OpPut(key, want)}, ops...)
	}
	return nil, fmt.Errorf("etcdfence: write under %v: the mark moved %d times during the call", t, maxRounds)
}

// sendError wraps err from a transaction that was sent: unless etcd said
// it refused the request, it may have been applied.
func sendError(t ownership.Token, err error) error {
	code := status.Code(err)
	if e, ok := errors.AsType[rpctypes.EtcdError](err); ok {
		code = e.Code()
	}
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange,
		codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted:
		return fmt.Errorf("etcdfence: write under %v refused: %w", t, err)
	}
	return fmt.Errorf("etcdfence: write under %v: %w: %v", t, ownership.ErrOutcomeUnknown, err)
}

// check rejects tokens that are never fenced, and unauthentic ones.
func (f *Fence) check(t ownership.Token) error {
	if t.Epoch == 0 {
		return fmt.Errorf("etcdfence: token %v: epoch 0 is never fenced (epochs start at 1)", t)
	}
	if f.verify != nil {
		if err := f.verify.Verify(t); err != nil {
			return fmt.Errorf("etcdfence: token %v: %w", t, err)
		}
	}
	return nil
}

// signed returns mark signed by the fence's Signer, if it has one.
func (f *Fence) signed(mark ownership.Token) ownership.Token {
	if f.sign == nil || mark.IsZero() {
		return mark
	}
	return f.sign.Sign(mark)
}
