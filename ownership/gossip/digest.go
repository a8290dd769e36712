package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tenure-go/tenure/ownership"
)

// The register travels by digest (issue 22). A node's periodic push/pull
// state carries a Digest of its register, not the register: a 64-bit hash
// per range of partitions, at most DigestRanges of them whatever the
// partition count, so a quiet push/pull costs the same at 271 partitions
// as at 65,536. A node whose digest differs from a peer's sends the peer a
// Section (the claims it holds in the ranges that differ, asking for an
// answer); the peer merges it and answers with a Section of the claims it
// holds above those (Register.Answer). After both merges the two registers
// agree on those ranges, as a whole-register exchange would have made them.

// DigestRanges is the most ranges a Digest cuts partitions into: a digest
// is at most DigestRanges x 8 bytes, however many partitions there are. A
// register of fewer partitions has one range per partition.
const DigestRanges = 32

// Ranges returns the number of ranges the digest of a register of
// partitions partitions has: min(partitions, DigestRanges), or 0 when
// partitions is not 1 to MaxPartitions.
func Ranges(partitions int) int {
	if partitions < 1 || partitions > MaxPartitions {
		return 0
	}
	return min(partitions, DigestRanges)
}

// RangeBounds returns the partitions [lo, hi) of range i of the digest of
// a register of partitions partitions. Ranges are consecutive, cover every
// partition once, and differ in size by at most one partition.
func RangeBounds(partitions, i int) (lo, hi uint32) {
	n := Ranges(partitions)
	if i < 0 || i >= n {
		return 0, 0
	}
	return uint32(i * partitions / n), uint32((i + 1) * partitions / n)
}

// RangeOf returns the range of the digest of a register of partitions
// partitions that partition p is in (-1 if p is out of range).
func RangeOf(partitions int, p uint32) int {
	n := Ranges(partitions)
	if n == 0 || int64(p) >= int64(partitions) {
		return -1
	}
	// The first i with p < hi(i) = floor((i+1)P/n): i = ceil((p+1)n/P) - 1.
	return int((int64(p)+1)*int64(n)+int64(partitions)-1)/partitions - 1
}

// A Digest summarises a register: for each of its Ranges(Partitions)
// ranges, a 64-bit hash of the claims in it, in partition order (see
// hashClaim). Registers that hold the same claims (MACs included) have
// equal digests; a difference in any claim changes its range's hash
// (barring a 64-bit collision).
type Digest struct {
	Partitions int
	Hashes     []uint64 // one per range
}

// Equal reports whether d and e are the same digest.
func (d Digest) Equal(e Digest) bool {
	return d.Partitions == e.Partitions && slices.Equal(d.Hashes, e.Hashes)
}

// Diff returns the ranges whose hashes differ between d and e, in
// increasing order (none when the registers agree). Digests of registers
// of different partition counts can't be compared: an error wrapping
// ownership.ErrPartitionRange.
func (d Digest) Diff(e Digest) ([]int, error) {
	if d.Partitions != e.Partitions || len(d.Hashes) != len(e.Hashes) {
		return nil, fmt.Errorf("%w: digest of %d partitions against one of %d",
			ownership.ErrPartitionRange, e.Partitions, d.Partitions)
	}
	var out []int
	for i := range d.Hashes {
		if d.Hashes[i] != e.Hashes[i] {
			out = append(out, i)
		}
	}
	return out, nil
}

// digestOf returns the digest of claims, a register's claims indexed by
// partition (the zero claim where there is none).
func digestOf(claims []Claim) Digest {
	d := Digest{Partitions: len(claims), Hashes: make([]uint64, Ranges(len(claims)))}
	for i := range d.Hashes {
		d.Hashes[i] = rangeHash(claims, i)
	}
	return d
}

// rangeHash returns the hash of range i of claims (indexed by partition).
func rangeHash(claims []Claim, i int) uint64 {
	lo, hi := RangeBounds(len(claims), i)
	h := uint64(fnvOffset)
	for _, c := range claims[lo:hi] {
		if !c.IsZero() {
			h = hashClaim(h, c)
		}
	}
	return h
}

// FNV-1a, 64 bits.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// hashClaim continues the FNV-1a hash h over c's partition, epoch,
// incarnation, released flag, owner (with its length) and MAC.
func hashClaim(h uint64, c Claim) uint64 {
	var b [4 + 8 + 8 + 1 + 1 + ownership.MACSize]byte
	t := c.Token
	binary.LittleEndian.PutUint32(b[0:], t.Partition)
	binary.LittleEndian.PutUint64(b[4:], t.Epoch)
	binary.LittleEndian.PutUint64(b[12:], t.Incarnation)
	if c.Released {
		b[20] = 1
	}
	b[21] = byte(len(t.Owner))
	copy(b[22:], t.MAC[:])
	for _, x := range b[:22] {
		h = (h ^ uint64(x)) * fnvPrime
	}
	for i := range len(t.Owner) {
		h = (h ^ uint64(t.Owner[i])) * fnvPrime
	}
	for _, x := range b[22:] {
		h = (h ^ uint64(x)) * fnvPrime
	}
	return h
}

// Digest returns the digest of r's claims. It is cached, and a change of
// the register recomputes only its range's hash at the next call: a quiet
// node's push/pulls reuse it, and a busy one's hash what changed.
func (r *Register) Digest() Digest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.digest.Hashes == nil {
		r.digest = digestOf(r.claims)
		r.dirty = make([]bool, len(r.digest.Hashes))
	}
	for i, d := range r.dirty {
		if d {
			r.digest.Hashes[i], r.dirty[i] = rangeHash(r.claims, i), false
		}
	}
	return Digest{Partitions: r.digest.Partitions, Hashes: slices.Clone(r.digest.Hashes)}
}

// A Section is part of a register: the claims its sender holds in some
// ranges of the register's digest. Sent with Ask set, it asks the receiver
// to merge it and to answer with Register.Answer; an answer has Ask unset.
type Section struct {
	Partitions int     // the register's partition count
	Ranges     []int   // ranges of the digest, increasing, at least one
	Claims     []Claim // the sender's claims in Ranges, in partition order
	Ask        bool    // the sender wants the receiver's claims above these
}

// Validate checks s's shape: partitions in 1 to MaxPartitions, ranges
// increasing and of its digest, claims non-zero, in increasing partition
// order and each in one of the ranges.
func (s Section) Validate() error {
	n := Ranges(s.Partitions)
	switch {
	case n == 0:
		return fmt.Errorf("gossip: section of %d partitions", s.Partitions)
	case len(s.Ranges) == 0:
		return errors.New("gossip: section of no ranges")
	}
	for i, x := range s.Ranges {
		if x < 0 || x >= n || i > 0 && x <= s.Ranges[i-1] {
			return fmt.Errorf("gossip: section range %d out of order or of range (%d ranges)", x, n)
		}
	}
	j := 0
	for i, c := range s.Claims {
		p := c.Token.Partition
		if c.Token.IsZero() || i > 0 && p <= s.Claims[i-1].Token.Partition {
			return fmt.Errorf("gossip: section claim %v zero or out of order", c.Token)
		}
		rg := RangeOf(s.Partitions, p)
		for j < len(s.Ranges) && s.Ranges[j] < rg {
			j++
		}
		if j == len(s.Ranges) || s.Ranges[j] != rg {
			return fmt.Errorf("gossip: section claim %v outside its ranges", c.Token)
		}
	}
	return nil
}

// Sections returns r's claims in ranges (increasing ranges of r's digest)
// as Sections that ask for an answer, each of whole ranges and at most
// maxClaims claims, except that a range of more claims than that is a
// Section of its own. It returns no Section for no ranges.
func (r *Register) Sections(ranges []int, maxClaims int) []Section {
	maxClaims = max(maxClaims, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Section
	cur := Section{Partitions: len(r.claims), Ask: true}
	for _, i := range ranges {
		lo, hi := RangeBounds(len(r.claims), i)
		if lo == hi {
			continue
		}
		var in []Claim
		for _, c := range r.claims[lo:hi] {
			if !c.IsZero() {
				in = append(in, c)
			}
		}
		if len(cur.Ranges) > 0 && len(cur.Claims)+len(in) > maxClaims {
			out = append(out, cur)
			cur = Section{Partitions: len(r.claims), Ask: true}
		}
		cur.Ranges = append(cur.Ranges, i)
		cur.Claims = append(cur.Claims, in...)
	}
	if len(cur.Ranges) > 0 {
		out = append(out, cur)
	}
	return out
}

// Answer returns the answer to an asking Section s: the claims r holds in
// s's ranges that rank above s's claim for their partition (or where s has
// none), in Sections of s's ranges with Ask unset, at most maxClaims claims
// each. It returns nothing when r has nothing above s, or when s is not a
// valid Section of r's partition count.
func (r *Register) Answer(s Section, maxClaims int) []Section {
	if s.Partitions != len(r.claims) || s.Validate() != nil {
		return nil
	}
	maxClaims = max(maxClaims, 1)
	theirs := make(map[uint32]Claim, len(s.Claims))
	for _, c := range s.Claims {
		theirs[c.Token.Partition] = c
	}
	var above []Claim
	r.mu.Lock()
	for _, i := range s.Ranges {
		lo, hi := RangeBounds(len(r.claims), i)
		for _, c := range r.claims[lo:hi] {
			if !c.IsZero() && ranksAbove(c, theirs[c.Token.Partition]) {
				above = append(above, c)
			}
		}
	}
	r.mu.Unlock()
	var out []Section
	for len(above) > 0 {
		n := min(len(above), maxClaims)
		out = append(out, Section{Partitions: s.Partitions, Ranges: s.Ranges, Claims: above[:n]})
		above = above[n:]
	}
	return out
}

// ranksAbove reports whether the register keeps c over d (observe's rule).
func ranksAbove(c, d Claim) bool {
	x := c.Compare(d)
	return x > 0 || x == 0 && string(c.Token.MAC[:]) > string(d.Token.MAC[:])
}
