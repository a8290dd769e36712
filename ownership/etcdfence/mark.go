package etcdfence

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
)

// The fence key of partition p is Prefix + "p/" + p in decimal. Its value,
// the mark, is the token's binary encoding (see ownership.Token's
// MarshalBinary) without a MAC: one encoding per token, so comparing the
// stored bytes with a token's is comparing the tokens.

// key is partition p's fence key.
func (f *Fence) key(p uint32) string {
	return f.prefix + "p/" + strconv.FormatUint(uint64(p), 10)
}

// encodeMark is t as a mark: its encoding without the MAC.
func encodeMark(t ownership.Token) (string, error) {
	t.MAC = [ownership.MACSize]byte{}
	b, err := t.MarshalBinary()
	if err != nil {
		return "", fmt.Errorf("etcdfence: token %v: %w", t, err)
	}
	return string(b), nil
}

// errCorrupt is wrapped by errors about a fence key whose value is not a
// mark this package wrote.
var errCorrupt = errors.New("etcdfence: corrupt mark")

// decodeMark reads the mark of partition p from the value of its fence
// key. A value that is not a token of p without a MAC, in epoch 1 or
// later, is an error wrapping ownership.ErrMalformedToken.
func decodeMark(p uint32, value []byte) (ownership.Token, error) {
	t, err := ownership.ParseToken(value)
	switch {
	case err != nil:
		return ownership.Token{}, fmt.Errorf("%w of p%d: %w", errCorrupt, p, err)
	case t.Partition != p:
		return ownership.Token{}, fmt.Errorf("%w of p%d: it holds a token of p%d: %w", errCorrupt, p, t.Partition, ownership.ErrMalformedToken)
	case t.Epoch == 0:
		return ownership.Token{}, fmt.Errorf("%w of p%d: epoch 0: %w", errCorrupt, p, ownership.ErrMalformedToken)
	case t.MAC != [ownership.MACSize]byte{}:
		return ownership.Token{}, fmt.Errorf("%w of p%d: it carries a MAC: %w", errCorrupt, p, ownership.ErrMalformedToken)
	}
	return t, nil
}

// markOf reads partition p's mark from the answer to a get of its fence
// key: the zero token of p and revision 0 if the key does not exist,
// else the mark and the key's mod revision.
func markOf(p uint32, kvs []*mvccpb.KeyValue) (ownership.Token, int64, error) {
	if len(kvs) == 0 {
		return ownership.Token{Partition: p}, 0, nil
	}
	t, err := decodeMark(p, kvs[0].Value)
	if err != nil {
		return ownership.Token{}, 0, err
	}
	return t, kvs[0].ModRevision, nil
}

// checkOps rejects ops that would write a key under the fence's prefix:
// a write to a mark in the same transaction as its check would undo what
// the check promises. Reads are allowed. Nested transactions are checked
// too.
func (f *Fence) checkOps(ops []clientv3.Op) error {
	for _, op := range ops {
		if op.IsTxn() {
			_, then, els := op.Txn()
			if err := f.checkOps(then); err != nil {
				return err
			}
			if err := f.checkOps(els); err != nil {
				return err
			}
			continue
		}
		if !op.IsPut() && !op.IsDelete() {
			continue
		}
		if f.overlaps(op.KeyBytes(), op.RangeBytes()) {
			return fmt.Errorf("etcdfence: an op writes %q, under the fence prefix %q", op.KeyBytes(), f.prefix)
		}
	}
	return nil
}

// overlaps reports whether the range [key, end) meets the keys under the
// fence prefix. In etcd's conventions an empty end is key alone, and an
// end of "\x00" (or a prefix's end of "\x00") is no end at all.
func (f *Fence) overlaps(key, end []byte) bool {
	if len(end) == 0 {
		return bytes.HasPrefix(key, []byte(f.prefix))
	}
	prefixEnd := []byte(clientv3.GetPrefixRangeEnd(f.prefix))
	// [key, end) and [prefix, prefixEnd) meet if each starts before the
	// other ends.
	keyBeforePrefixEnd := bytes.Equal(prefixEnd, []byte{0}) || bytes.Compare(key, prefixEnd) < 0
	prefixBeforeEnd := bytes.Equal(end, []byte{0}) || bytes.Compare([]byte(f.prefix), end) < 0
	return keyBeforePrefixEnd && prefixBeforeEnd
}
