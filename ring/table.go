package ring

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Table maps keys to partitions and partitions to owners for one member set
// and Config. It is immutable: every method may be called from any number of
// goroutines at once without locking, and lookups do not allocate. A Table is
// a function of the member set and Config only (not of the order of the input
// slice), so every node that builds a Table from the same members and Config
// with the same AlgorithmVersion gets the same placement.
//
// Partitions are numbered 0 to Partitions()-1 and are uint32 everywhere in
// tenure (ring, ownership tokens, the coordinator).
//
// A nil *Table is an empty table: it has no partitions and no members, and
// every lookup returns partition 0 and owner "".
type Table struct {
	cfg     Config
	nparts  uint64
	members []string // sorted, distinct
	loads   []int    // partitions owned, by member index
	owners  []string // owner name, by partition
	ownerIx []int32  // owner member index, by partition
	start   []int32  // ring index where the partition's walk starts, by partition
	ring    []point  // virtual nodes, ascending by (hash, member)
	byHash  []point  // partitions, ascending by hash (id: the partition); shared by rebuilt tables
	fp      uint64
}

// point is a position on the hash ring: a virtual node (id is the member's
// index) or, while placing, a partition (id is the partition).
type point struct {
	hash uint64
	id   int32
}

// New builds the Table of the given members under cfg. It copies members and
// ignores their order. It returns an error, and never panics, if cfg is
// invalid (ErrInvalidConfig), members is empty (ErrNoMembers), members times
// VirtualNodes exceeds MaxRingSize (ErrTooManyMembers), or a name is empty,
// longer than MaxMemberNameLen or contains a NUL byte (ErrInvalidMember) or
// appears twice (ErrDuplicateMember).
//
// There may be more members than partitions: each member then owns at most
// ceil(Partitions/members × Load) partitions, and some own none (Load 0). They
// are still members: they appear in Members and Replicas.
//
// Building takes time and memory linear in members × VirtualNodes plus
// Partitions, and the Table keeps the ring (16 bytes per point) for Replicas
// and the partitions' hashes (16 bytes per partition, shared with the
// Tables Rebuild makes from it); see the package documentation for
// measurements.
func New(members []string, cfg Config) (*Table, error) {
	return build(members, cfg, nil)
}

// Rebuild returns the Table that New(members, cfg) returns for t's Config
// cfg, with the same errors, built faster when members share most names
// with t's: it hashes and sorts only the virtual nodes of names new to t
// and merges them with t's ring, in time linear in members × VirtualNodes
// plus Partitions (New hashes and sorts every point). A nil t has no
// Config: Rebuild then returns ErrInvalidConfig.
func (t *Table) Rebuild(members []string) (*Table, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: Rebuild of a nil Table", ErrInvalidConfig)
	}
	return build(members, t.cfg, t)
}

// build is New, reusing prev's ring (nil: none).
func build(members []string, cfg Config, prev *Table) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case len(members) == 0:
		return nil, ErrNoMembers
	case len(members) > MaxRingSize/cfg.VirtualNodes:
		return nil, fmt.Errorf("%w: %d members times %d virtual nodes exceeds %d ring points",
			ErrTooManyMembers, len(members), cfg.VirtualNodes, MaxRingSize)
	}
	names := slices.Clone(members)
	slices.Sort(names)
	for i, name := range names {
		if err := checkName(name); err != nil {
			return nil, err
		}
		if i > 0 && names[i-1] == name {
			return nil, fmt.Errorf("%w: %q", ErrDuplicateMember, name)
		}
	}

	t := &Table{
		cfg:     cfg,
		nparts:  uint64(cfg.Partitions),
		members: names,
		loads:   make([]int, len(names)),
		owners:  make([]string, cfg.Partitions),
		ownerIx: make([]int32, cfg.Partitions),
		start:   make([]int32, cfg.Partitions),
	}
	if prev == nil || !t.reuseRing(prev) {
		t.ring = buildRing(names, cfg.VirtualNodes)
	}
	if prev != nil {
		t.byHash = prev.byHash // a function of Partitions alone, prev's too
	} else {
		t.byHash = partitionsByHash(cfg.Partitions)
	}
	if err := t.place(); err != nil {
		return nil, err
	}
	t.fp = fingerprint(cfg, names)
	return t, nil
}

func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidMember)
	case len(name) > MaxMemberNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidMember, len(name), MaxMemberNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidMember, name)
	}
	return nil
}

// buildRing returns the virtual nodes of names (sorted, distinct), sorted by
// hash and then by member. Virtual node i of member m is hashed as
// "<i>:<m>\x00", consistent v1.0.0's key for a member whose String() is
// m+"\x00". The NUL suffix (NUL is forbidden in names) keeps keys unambiguous
// whatever their layout. On a 64-bit hash collision consistent gives every
// colliding point to the member added last; members are added in ascending
// order, so that is the greatest name, here as there.
func buildRing(names []string, vnodes int) []point {
	ring := ringPoints(names, vnodes)
	lastAddedWins(ring)
	return ring
}

// ringPoints returns the virtual nodes of names sorted by hash and then by
// member, before lastAddedWins.
func ringPoints(names []string, vnodes int) []point {
	ring := make([]point, 0, len(names)*vnodes)
	buf := make([]byte, 0, 24+MaxMemberNameLen)
	for m, name := range names {
		for i := range vnodes {
			buf = strconv.AppendInt(buf[:0], int64(i), 10)
			buf = append(buf, ':')
			buf = append(buf, name...)
			buf = append(buf, 0)
			ring = append(ring, point{hash: xxhash.Sum64(buf), id: int32(m)})
		}
	}
	return sortPoints(ring)
}

// reuseRing sets t.ring to buildRing(t.members, VirtualNodes) by merging
// the points of the members t shares with prev, taken from prev's ring,
// with those of the members new to t, and reports whether it did. It
// doesn't when prev's ring has two points of equal hash: lastAddedWins
// changed their members there, and the merge needs them (a 64-bit
// collision: about one ring in a billion at a thousand members).
func (t *Table) reuseRing(prev *Table) bool {
	// remap[i] is prev's member i's index in t, or -1; added lists t's
	// members that prev doesn't have. Both member lists are sorted.
	remap := make([]int32, len(prev.members))
	var added []string
	var addedIx []int32
	i := 0
	for j, name := range t.members {
		for i < len(prev.members) && prev.members[i] < name {
			remap[i] = -1
			i++
		}
		if i < len(prev.members) && prev.members[i] == name {
			remap[i] = int32(j)
			i++
			continue
		}
		added = append(added, name)
		addedIx = append(addedIx, int32(j))
	}
	for ; i < len(prev.members); i++ {
		remap[i] = -1
	}
	fresh := ringPoints(added, t.cfg.VirtualNodes)
	for i := range fresh {
		fresh[i].id = addedIx[fresh[i].id] // from added's index to t's
	}
	out := make([]point, 0, len(t.members)*t.cfg.VirtualNodes)
	k := 0
	for x, p := range prev.ring {
		if x > 0 && prev.ring[x-1].hash == p.hash {
			return false
		}
		id := remap[p.id]
		if id < 0 {
			continue
		}
		// Ties go to the lower member index, as buildRing's stable sort
		// of points in member order leaves them.
		for k < len(fresh) && (fresh[k].hash < p.hash || fresh[k].hash == p.hash && fresh[k].id < id) {
			out = append(out, fresh[k])
			k++
		}
		out = append(out, point{hash: p.hash, id: id})
	}
	out = append(out, fresh[k:]...)
	lastAddedWins(out)
	t.ring = out
	return true
}

// lastAddedWins gives each run of points with equal hash in a sorted ring to
// the run's last point's member.
func lastAddedWins(ring []point) {
	for i := len(ring) - 2; i >= 0; i-- {
		if ring[i].hash == ring[i+1].hash {
			ring[i].id = ring[i+1].id
		}
	}
}

// place assigns every partition an owner with consistent v1.0.0's bounded
// load walk: partitions in ascending order, each to the first point at or
// after hash(partition) whose member still has room under the load bound.
func (t *Table) place() error {
	t.findStarts()
	limit := t.cfg.maxLoad(len(t.members))
	for p := range t.owners {
		idx := int(t.start[p])
		for n := 0; ; n++ {
			if n == len(t.ring) {
				// Unreachable while Load >= 1, since members × bound >=
				// Partitions; consistent panics here, we refuse.
				return fmt.Errorf("%w: no member has room for partition %d", ErrInvalidConfig, p)
			}
			m := t.ring[idx].id
			if float64(t.loads[m]+1) <= limit {
				t.loads[m]++
				t.owners[p] = t.members[m]
				t.ownerIx[p] = m
				break
			}
			if idx++; idx == len(t.ring) {
				idx = 0
			}
		}
	}
	return nil
}

// findStarts sets start[p] to the index of the first point whose hash is at
// least the hash of partition p (its little-endian 8-byte id), wrapping to 0.
// It merges the partitions, sorted by hash, with the ring.
func (t *Table) findStarts() {
	idx := 0
	for _, part := range t.byHash {
		for idx < len(t.ring) && t.ring[idx].hash < part.hash {
			idx++
		}
		if idx == len(t.ring) {
			t.start[part.id] = 0
		} else {
			t.start[part.id] = int32(idx)
		}
	}
}

// partitionsByHash returns partitions 0 to n-1 as points, sorted by the
// hash of each one's little-endian 8-byte id.
func partitionsByHash(n int) []point {
	parts := make([]point, n)
	var key [8]byte
	for p := range parts {
		binary.LittleEndian.PutUint64(key[:], uint64(p))
		parts[p] = point{hash: xxhash.Sum64(key[:]), id: int32(p)}
	}
	return sortPoints(parts)
}

// sortPoints sorts points by hash, keeping points of equal hash in their
// input order, and returns the sorted slice (a or a new one). It is an LSD
// radix sort, one byte per pass: building the ring of a thousand members is
// a sort of a few hundred thousand points, which a comparison sort makes the
// dominant cost of New.
func sortPoints(a []point) []point {
	if len(a) < 2 {
		return a
	}
	b := make([]point, len(a))
	for shift := uint(0); shift < 64; shift += 8 {
		var count [257]int
		for _, p := range a {
			count[int(byte(p.hash>>shift))+1]++
		}
		if count[int(byte(a[0].hash>>shift))+1] == len(a) {
			continue // every point has the same digit: the pass is a no-op
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, p := range a {
			d := byte(p.hash >> shift)
			b[count[d]] = p
			count[d]++
		}
		a, b = b, a
	}
	return a
}

func fingerprint(cfg Config, names []string) uint64 {
	d := xxhash.New()
	var b [8]byte
	word := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		_, _ = d.Write(b[:])
	}
	_, _ = d.WriteString(AlgorithmVersion)
	word(uint64(cfg.Partitions))
	word(uint64(cfg.VirtualNodes))
	word(math.Float64bits(cfg.Load))
	word(uint64(len(names)))
	for _, name := range names {
		word(uint64(len(name)))
		_, _ = d.WriteString(name)
	}
	return d.Sum64()
}

// Partitions returns the number of partitions (Config.Partitions), or 0 for a
// nil Table.
func (t *Table) Partitions() int {
	if t == nil {
		return 0
	}
	return len(t.owners)
}

// Partition returns the partition of key: xxhash64(key) mod Partitions, the
// same as consistent's FindPartitionID with an xxhash64 hasher. It does not
// depend on the members. It does not allocate.
func (t *Table) Partition(key []byte) uint32 {
	if t == nil {
		return 0
	}
	return reduce(xxhash.Sum64(key), t.nparts)
}

// PartitionString is Partition for a string key. It does not allocate.
func (t *Table) PartitionString(key string) uint32 {
	if t == nil {
		return 0
	}
	return reduce(xxhash.Sum64String(key), t.nparts)
}

// Owner returns the member that owns partition, or "" if partition is out of
// range.
func (t *Table) Owner(partition uint32) string {
	if t == nil || uint64(partition) >= uint64(len(t.owners)) {
		return ""
	}
	return t.owners[partition]
}

// Lookup returns the partition of key and its owner. It does not lock or
// allocate.
func (t *Table) Lookup(key []byte) (partition uint32, owner string) {
	if t == nil {
		return 0, ""
	}
	p := reduce(xxhash.Sum64(key), t.nparts)
	return p, t.owners[p]
}

// LookupString is Lookup for a string key. It does not lock or allocate.
func (t *Table) LookupString(key string) (partition uint32, owner string) {
	if t == nil {
		return 0, ""
	}
	p := reduce(xxhash.Sum64String(key), t.nparts)
	return p, t.owners[p]
}

// Replicas returns min(n, number of members) distinct members for partition,
// in a stable order: the owner first, then the other members in the order
// they follow the partition's hash on the ring. The list is a function of the
// Table alone, and a membership change disturbs it little. The replicas after
// the first are not bounded by Config.Load. Replicas returns nil if n < 1 or
// partition is out of range. The caller owns the returned slice.
func (t *Table) Replicas(partition uint32, n int) []string {
	if t == nil || n < 1 || uint64(partition) >= uint64(len(t.owners)) {
		return nil
	}
	n = min(n, len(t.members))
	out := make([]string, 1, n)
	out[0] = t.owners[partition]
	if n == 1 {
		return out
	}
	seen := make([]bool, len(t.members))
	seen[t.ownerIx[partition]] = true
	idx := int(t.start[partition])
	for range t.ring {
		if m := t.ring[idx].id; !seen[m] {
			seen[m] = true
			out = append(out, t.members[m])
			if len(out) == n {
				break
			}
		}
		if idx++; idx == len(t.ring) {
			idx = 0
		}
	}
	return out
}

// Members returns the members in ascending order. The caller owns the
// returned slice.
func (t *Table) Members() []string {
	if t == nil {
		return nil
	}
	return slices.Clone(t.members)
}

// Len returns the number of members.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.members)
}

// Has reports whether member is in the Table. It does not allocate.
func (t *Table) Has(member string) bool {
	_, ok := t.index(member)
	return ok
}

// Share returns the number of partitions member owns, 0 if it is not a
// member: its share of the ring, in partitions. (It is not a load in the
// sense of work done; the ring knows nothing of that.)
func (t *Table) Share(member string) int {
	if m, ok := t.index(member); ok {
		return t.loads[m]
	}
	return 0
}

// Load returns the number of partitions member owns.
//
// Deprecated: use Share. "Load" is kept for the work a partition costs.
func (t *Table) Load(member string) int { return t.Share(member) }

// PartitionsOf returns the partitions member owns, in ascending order; nil if
// it owns none. The caller owns the returned slice.
func (t *Table) PartitionsOf(member string) []uint32 {
	m, ok := t.index(member)
	if !ok || t.loads[m] == 0 {
		return nil
	}
	out := make([]uint32, 0, t.loads[m])
	for p, o := range t.ownerIx {
		if int(o) == m {
			out = append(out, uint32(p))
		}
	}
	return out
}

func (t *Table) index(member string) (int, bool) {
	if t == nil {
		return 0, false
	}
	return slices.BinarySearch(t.members, member)
}

// Config returns the Config the Table was built with (the zero Config for a
// nil Table).
func (t *Table) Config() Config {
	if t == nil {
		return Config{}
	}
	return t.cfg
}

// Fingerprint returns a 64-bit hash of AlgorithmVersion, the Config and the
// member set. Tables built from the same members and Config have the same
// fingerprint, whatever the order of the input; nodes can compare
// fingerprints to check that they agree on the table. A nil Table has
// fingerprint 0.
func (t *Table) Fingerprint() uint64 {
	if t == nil {
		return 0
	}
	return t.fp
}
