package gossip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"sync"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/internal/wire"
)

// A Claim is what gossip says about a partition: the highest token granted
// for it, and whether its owner has released it (handed it off cleanly, so
// the next owner may claim without waiting out a grace period).
//
// Claims are ordered by token, and for the same token a release ranks above
// the grant it releases. Any higher token ranks above both.
type Claim struct {
	Token    ownership.Token
	Released bool
}

// Compare orders c and d (see Claim) and returns -1, 0 or +1.
func (c Claim) Compare(d Claim) int {
	if x := c.Token.Compare(d.Token); x != 0 {
		return x
	}
	switch {
	case c.Released == d.Released:
		return 0
	case c.Released:
		return 1
	}
	return -1
}

// IsZero reports whether c is the zero claim: nothing known.
func (c Claim) IsZero() bool { return c == Claim{} }

func (c Claim) String() string {
	if c.Released {
		return c.Token.String() + " released"
	}
	return c.Token.String()
}

// AppendBinary appends the encoding of c to b: the token's binary encoding,
// with flag bit 1 set for a release. It fails, wrapping ErrMalformedToken,
// only when the owner is longer than MaxOwnerSize. An encoded claim is at
// most MaxTokenSize bytes, and an unreleased claim's encoding is its
// token's.
func (c Claim) AppendBinary(b []byte) ([]byte, error) {
	n := len(b)
	b, err := c.Token.AppendBinary(b)
	if err == nil && c.Released {
		b[n+1] |= wire.FlagReleased // the flags byte follows the version
	}
	return b, err
}

// MarshalBinary returns the encoding of c.
func (c Claim) MarshalBinary() ([]byte, error) {
	return c.AppendBinary(make([]byte, 0, ownership.MaxTokenSize))
}

// UnmarshalBinary sets *c to the claim encoded in b. On error *c is
// unchanged.
func (c *Claim) UnmarshalBinary(b []byte) error {
	d, err := ParseClaim(b)
	if err != nil {
		return err
	}
	*c = d
	return nil
}

// ParseClaim decodes a claim. Any input that is not the canonical encoding
// of a claim yields an error wrapping ErrMalformedToken.
func ParseClaim(b []byte) (Claim, error) {
	released := len(b) > 1 && b[1]&wire.FlagReleased != 0
	if released {
		b = slices.Clone(b)
		b[1] &^= wire.FlagReleased
	}
	t, err := ownership.ParseToken(b)
	if err != nil {
		return Claim{}, err
	}
	return Claim{Token: t, Released: released}, nil
}

// MaxPartitions is the largest partition count a Register holds.
const MaxPartitions = 1 << 16

// A Register is the gossiped knowledge of a node: for every partition, the
// highest claim heard. Registers merge by taking the higher claim per
// partition, so merging is idempotent, commutative and associative, and
// registers that have heard the same claims in any order agree.
//
// All nodes of a cluster must use the same partition count. A Register is
// safe for concurrent use.
type Register struct {
	mu     sync.Mutex
	claims []Claim // indexed by partition; Token.Partition matches
	n      int     // non-zero claims

	digest Digest // cached by Digest; nil Hashes until the first call
	dirty  []bool // per range: changed since digest was computed
}

// NewRegister returns an empty register for partitions 0 to partitions-1,
// at most MaxPartitions.
func NewRegister(partitions int) (*Register, error) {
	if partitions < 1 || partitions > MaxPartitions {
		return nil, fmt.Errorf("gossip: register needs 1 to %d partitions, got %d", MaxPartitions, partitions)
	}
	return &Register{claims: make([]Claim, partitions)}, nil
}

// Partitions returns the number of partitions r was built for.
func (r *Register) Partitions() int { return len(r.claims) }

// Len returns the number of partitions with a claim.
func (r *Register) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Observe records a grant of t; see ObserveClaim.
func (r *Register) Observe(t ownership.Token) bool { return r.ObserveClaim(Claim{Token: t}) }

// ObserveClaim records c if it is higher than the claim held for its
// partition (or equal with a greater MAC), and reports whether it was. A
// claim with the zero token, for a partition out of range, or with an owner
// longer than MaxOwnerSize is ignored (false).
func (r *Register) ObserveClaim(c Claim) bool {
	if !r.valid(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.observe(c)
}

func (r *Register) valid(c Claim) bool {
	return !c.Token.IsZero() && int64(c.Token.Partition) < int64(len(r.claims)) &&
		len(c.Token.Owner) <= ownership.MaxOwnerSize
}

// observe is ObserveClaim for a valid claim, with r.mu held. Between claims
// that differ only in their MACs (signed under different keys) it keeps the
// greater MAC, so registers converge to the same bytes whatever the order.
func (r *Register) observe(c Claim) bool {
	cur := &r.claims[c.Token.Partition]
	if x := c.Compare(*cur); x < 0 || x == 0 && bytes.Compare(c.Token.MAC[:], cur.Token.MAC[:]) <= 0 {
		return false
	}
	if cur.IsZero() {
		r.n++
	}
	*cur = c
	if r.dirty != nil {
		r.dirty[RangeOf(len(r.claims), c.Token.Partition)] = true
	}
	return true
}

// Get returns the highest token known for partition p: the zero token if
// none is, or if p is out of range.
func (r *Register) Get(p uint32) ownership.Token { return r.GetClaim(p).Token }

// GetClaim returns the highest claim known for partition p: the zero claim
// if none is, or if p is out of range.
func (r *Register) GetClaim(p uint32) Claim {
	if int64(p) >= int64(len(r.claims)) {
		return Claim{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claims[p]
}

// HeldBy counts the partitions whose highest claim owner holds (not
// released), under one lock: a count by GetClaim takes one a partition.
func (r *Register) HeldBy(owner string) int {
	if owner == "" {
		return 0 // the zero claim's: nothing known
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.claims {
		if !c.Released && c.Token.Owner == owner {
			n++
		}
	}
	return n
}

// All yields the claims held, in partition order. It iterates over a
// snapshot taken when iteration starts, so the register may change (even
// from inside the loop) without affecting it.
func (r *Register) All() iter.Seq[Claim] {
	return func(yield func(Claim) bool) {
		for _, c := range r.snapshot() {
			if !yield(c) {
				return
			}
		}
	}
}

// snapshot returns a copy of the non-zero claims in partition order.
func (r *Register) snapshot() []Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Claim, 0, r.n)
	for _, c := range r.claims {
		if !c.IsZero() {
			out = append(out, c)
		}
	}
	return out
}

// Merge raises each of r's claims to other's where other's is higher, and
// returns the claims that changed in r, in partition order. The registers
// must have the same partition count (otherwise an error wrapping
// ErrPartitionRange, and r is unchanged). other is read from a snapshot, so
// registers may merge into each other concurrently.
func (r *Register) Merge(other *Register) ([]Claim, error) {
	if other == nil {
		return nil, errors.New("gossip: merging a nil register")
	}
	if len(other.claims) != len(r.claims) {
		return nil, fmt.Errorf("%w: merging a register of %d partitions into one of %d",
			ownership.ErrPartitionRange, len(other.claims), len(r.claims))
	}
	in := other.snapshot()
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []Claim
	for _, c := range in {
		if r.observe(c) {
			changed = append(changed, c)
		}
	}
	return changed, nil
}

// mint records and returns the next token of partition p for n, under r's
// lock so concurrent mints get distinct epochs: its epoch is one above both
// seen and the highest epoch r knows for p. sign may be nil.
func (r *Register) mint(p uint32, seen uint64, n ownership.Node, sign func(ownership.Token) ownership.Token) (ownership.Token, error) {
	if int64(p) >= int64(len(r.claims)) {
		return ownership.Token{}, fmt.Errorf("%w: partition %d, register has %d", ownership.ErrPartitionRange, p, len(r.claims))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := max(r.claims[p].Token.Epoch, seen)
	if e == math.MaxUint64 {
		return ownership.Token{}, fmt.Errorf("gossip: epoch of partition %d exhausted", p)
	}
	t := ownership.Token{Partition: p, Epoch: e + 1, Owner: n.Name, Incarnation: n.Incarnation}
	if sign != nil {
		t = sign(t)
	}
	r.observe(Claim{Token: t})
	return t, nil
}

// Register state encoding, version 1, for memberlist push/pull:
//
//	version     1 byte, always 1
//	partitions  uvarint, 1 to MaxPartitions
//	nodes       uvarint count, then per node: 1 byte name length, name,
//	            uvarint incarnation; in order of first use below, each used
//	claims      uvarint count, then per claim, in increasing partition order:
//	            uvarint gap (partition minus the previous claim's partition
//	            plus one; the first claim's partition), uvarint node index,
//	            uvarint epoch, 1 byte flags (bit 0 MAC follows, bit 1
//	            released), MACSize bytes of MAC if flagged
//
// Only partitions with a claim are encoded, and each owner's name once. The
// encoding is canonical: decoding then encoding gives back the input.
const registerVersion = 1

// AppendBinary appends the encoding of r's state to b.
func (r *Register) AppendBinary(b []byte) ([]byte, error) {
	return appendClaims(b, len(r.claims), r.snapshot()), nil
}

// appendClaims appends the register encoding of claims (non-zero, in
// increasing partition order) of a register of partitions partitions.
func appendClaims(b []byte, partitions int, claims []Claim) []byte {
	index := make(map[ownership.Node]int)
	var nodes []ownership.Node
	for _, c := range claims {
		n := c.Token.Node()
		if _, ok := index[n]; !ok {
			index[n] = len(nodes)
			nodes = append(nodes, n)
		}
	}
	b = append(b, registerVersion)
	b = binary.AppendUvarint(b, uint64(partitions))
	b = binary.AppendUvarint(b, uint64(len(nodes)))
	for _, n := range nodes {
		b = append(b, byte(len(n.Name)))
		b = append(b, n.Name...)
		b = binary.AppendUvarint(b, n.Incarnation)
	}
	b = binary.AppendUvarint(b, uint64(len(claims)))
	next := uint32(0)
	for _, c := range claims {
		t := c.Token
		b = binary.AppendUvarint(b, uint64(t.Partition-next))
		next = t.Partition + 1
		b = binary.AppendUvarint(b, uint64(index[t.Node()]))
		b = binary.AppendUvarint(b, t.Epoch)
		flags := wire.Flags(t.MAC != [ownership.MACSize]byte{}, c.Released)
		b = append(b, flags)
		if flags&wire.FlagMAC != 0 {
			b = append(b, t.MAC[:]...)
		}
	}
	return b
}

// MarshalBinary returns the encoding of r's state.
func (r *Register) MarshalBinary() ([]byte, error) { return r.AppendBinary(nil) }

// UnmarshalRegister decodes a register's state. Any input that is not a
// canonical encoding yields an error wrapping ErrMalformedToken. Merge the
// result into the local register.
func UnmarshalRegister(b []byte) (*Register, error) {
	parts, claims, err := readClaims(b, 0)
	if err != nil {
		return nil, err
	}
	return registerOf(parts, claims), nil
}

// registerOf returns a register of parts partitions holding claims (valid,
// in increasing partition order).
func registerOf(parts int, claims []Claim) *Register {
	r := &Register{claims: make([]Claim, parts)}
	for _, c := range claims {
		r.claims[c.Token.Partition] = c
	}
	r.n = len(claims)
	return r
}

// readClaims decodes a register's encoding into its partition count and
// its claims, in increasing partition order, without allocating for the
// partitions that have none. Unless want is zero, a register of another
// partition count than want is refused (an error wrapping
// ErrPartitionRange) before anything is allocated.
func readClaims(b []byte, want int) (int, []Claim, error) {
	d := wire.Decoder{B: b}
	if v := d.Byte(); d.OK() && v != registerVersion {
		return 0, nil, wire.Malformed("register: unknown version %d", v)
	}
	parts := d.Uvarint()
	if d.OK() && (parts < 1 || parts > MaxPartitions) {
		return 0, nil, wire.Malformed("register: %d partitions", parts)
	}
	if d.OK() && want != 0 && parts != uint64(want) {
		return 0, nil, partitionCount("register", parts, want)
	}
	nn := d.Uvarint()
	// Each node takes at least 2 bytes and is used by a distinct claim.
	if d.OK() && (nn > parts || nn > uint64(len(d.B))/2) {
		return 0, nil, wire.Malformed("register: %d nodes", nn)
	}
	nodes := make([]ownership.Node, 0, nn)
	seen := make(map[ownership.Node]bool, nn)
	for range nn {
		n := ownership.Node{Name: string(d.Bytes(int(d.Byte())))}
		n.Incarnation = d.Uvarint()
		if !d.OK() {
			return 0, nil, d.Err()
		}
		if seen[n] {
			return 0, nil, wire.Malformed("register: node %v twice", n)
		}
		seen[n] = true
		nodes = append(nodes, n)
	}
	nc := d.Uvarint()
	// Each claim takes at least 4 bytes.
	if d.OK() && (nc > parts || nc > uint64(len(d.B))/4) {
		return 0, nil, wire.Malformed("register: %d claims", nc)
	}
	if !d.OK() {
		return 0, nil, d.Err()
	}
	claims := make([]Claim, 0, nc)
	next, used := uint64(0), uint64(0)
	for range nc {
		gap := d.Uvarint()
		p := next + min(gap, parts) // no wrap-around: both are small
		ni := d.Uvarint()
		epoch := d.Uvarint()
		flags := d.Byte()
		var mac [ownership.MACSize]byte
		if flags&wire.FlagMAC != 0 {
			copy(mac[:], d.Bytes(ownership.MACSize))
		}
		switch {
		case !d.OK():
			return 0, nil, d.Err()
		case p >= parts:
			return 0, nil, wire.Malformed("register: partition %d out of range", p)
		case ni > used || ni >= nn:
			return 0, nil, wire.Malformed("register: node index %d out of order", ni)
		case flags&^(wire.FlagMAC|wire.FlagReleased) != 0:
			return 0, nil, wire.Malformed("register: unknown flags %#x", flags)
		case flags&wire.FlagMAC != 0 && mac == [ownership.MACSize]byte{}:
			return 0, nil, wire.Malformed("register: MAC flag with an all-zero MAC")
		}
		if ni == used {
			used++
		}
		n := nodes[ni]
		c := Claim{
			Token:    ownership.Token{Partition: uint32(p), Epoch: epoch, Owner: n.Name, Incarnation: n.Incarnation, MAC: mac},
			Released: flags&wire.FlagReleased != 0,
		}
		if c.Token.IsZero() {
			return 0, nil, wire.Malformed("register: zero token for partition %d", p)
		}
		claims = append(claims, c)
		next = p + 1
	}
	if err := d.End(); err != nil {
		return 0, nil, err
	}
	if used != nn {
		return 0, nil, wire.Malformed("register: %d of %d nodes unused", nn-used, nn)
	}
	return int(parts), claims, nil
}
