package etcdfence

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

// FuzzDecodeMark: a fence key's value comes from etcd, so from the
// network. Decoding never panics; what decodes is a token of the
// partition, epoch 1 or later, without a MAC, that encodes back to the
// same bytes; anything else wraps ownership.ErrMalformedToken.
func FuzzDecodeMark(f *testing.F) {
	for _, t := range []ownership.Token{
		{Partition: 3, Epoch: 1, Owner: "a", Incarnation: 1},
		{Partition: 3, Epoch: 1 << 40, Owner: "node-17", Incarnation: 1 << 63},
		{Partition: 3, Epoch: 2},
	} {
		b, err := encodeMark(t)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint32(3), []byte(b))
		f.Add(uint32(4), []byte(b)) // a mark of another partition
	}
	signed := ownership.Token{Partition: 3, Epoch: 1, Owner: "a", MAC: [ownership.MACSize]byte{1}}
	b, _ := signed.MarshalBinary()
	f.Add(uint32(3), b)
	f.Add(uint32(4), []byte{})
	f.Add(uint32(0), []byte("garbage"))
	f.Fuzz(func(t *testing.T, p uint32, value []byte) {
		mark, err := decodeMark(p, value)
		if err != nil {
			if !errors.Is(err, ownership.ErrMalformedToken) {
				t.Fatalf("decodeMark(%d, %x) = %v, not wrapping ErrMalformedToken", p, value, err)
			}
			return
		}
		if mark.Partition != p || mark.Epoch == 0 || mark.MAC != [ownership.MACSize]byte{} {
			t.Fatalf("decodeMark(%d, %x) = %v", p, value, mark)
		}
		again, err := encodeMark(mark)
		if err != nil || again != string(value) {
			t.Fatalf("mark %v from %x encodes to %x, %v", mark, value, again, err)
		}
	})
}

// FuzzOverlaps checks the guard that keeps Do's ops off the marks
// against a reference: a range meets the prefix's keys exactly when the
// larger of its start and the prefix is a key under the prefix inside the
// range (every key between the prefix and its range end starts with it).
func FuzzOverlaps(f *testing.F) {
	f.Add("t/f/", []byte("t/f/p/1"), []byte(nil))
	f.Add("t/f/", []byte("t/"), []byte("t/g"))
	f.Add("t/f/", []byte(""), []byte{0})
	f.Add("t/f/", []byte("t/f"), []byte("t/f/"))
	f.Add("\xff\xff", []byte("a"), []byte{0})
	f.Fuzz(func(t *testing.T, prefix string, key, end []byte) {
		if prefix == "" {
			return // New never builds a fence with an empty prefix
		}
		fence := &Fence{prefix: prefix}
		got := fence.overlaps(key, end)
		p := []byte(prefix)
		var want bool
		if len(end) == 0 {
			want = bytes.HasPrefix(key, p)
		} else if !bytes.Equal(end, []byte{0}) && bytes.Compare(end, key) <= 0 {
			return // an empty range writes nothing: either answer is safe
		} else {
			w := key
			if bytes.Compare(p, key) > 0 {
				w = p
			}
			inRange := bytes.Compare(w, key) >= 0 && (bytes.Equal(end, []byte{0}) || bytes.Compare(w, end) < 0)
			want = bytes.HasPrefix(w, p) && inRange
		}
		if got != want {
			t.Fatalf("overlaps(prefix %q, [%q, %q)) = %v, want %v", prefix, key, end, got, want)
		}
	})
}
