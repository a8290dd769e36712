package gossip

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

func macTestKey(b byte) ownership.Key { return bytes.Repeat([]byte{b}, 32) }

func memTok(p uint32, epoch uint64, owner string) ownership.Token {
	return ownership.Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: epoch * 7}
}

// codecTokens are ownership's codec test tokens: the edges of each field.
func codecTokens() []ownership.Token {
	mac := [ownership.MACSize]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	return []ownership.Token{
		{},
		{Partition: 3, Epoch: 1, Owner: "node-a", Incarnation: 0x1234},
		{Partition: math.MaxUint32, Epoch: math.MaxUint64, Owner: strings.Repeat("x", ownership.MaxOwnerSize), Incarnation: math.MaxUint64, MAC: mac},
		{Partition: 127, Epoch: 128, Owner: "", Incarnation: 16384},
		{Partition: 0, Epoch: 7, Owner: "ünïcode", Incarnation: 1, MAC: [ownership.MACSize]byte{15: 1}},
		{Owner: "\x00\xff not utf-8"},
	}
}

// decodeFailed reports whether a decoder returned an error, and fails t if
// the error does not wrap ErrMalformedToken.
func decodeFailed(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && !errors.Is(err, ownership.ErrMalformedToken) {
		t.Fatalf("error %v does not wrap ErrMalformedToken", err)
	}
	return err != nil
}

// wrongCount reports whether a decoder told to expect want%(MaxPartitions+1)
// partitions (any, if zero) refused a message of another count, and fails
// t if it did so with an error that does not wrap ErrPartitionRange, or
// decoded one of the wrong count (*parts, when err is nil).
func wrongCount(t *testing.T, err error, want uint32, parts *int) bool {
	t.Helper()
	w := int(want % (MaxPartitions + 1))
	if err == nil && w != 0 && *parts != w {
		t.Fatalf("decoded %d partitions for a node of %d", *parts, w)
	}
	if errors.Is(err, ownership.ErrPartitionRange) {
		if w == 0 {
			t.Fatalf("error %v, expecting any partition count", err)
		}
		return true
	}
	return false
}
