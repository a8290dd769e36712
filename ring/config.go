package ring

import (
	"errors"
	"fmt"
	"math"
)

// AlgorithmVersion names the placement algorithm of this package: the bounded
// load placement of github.com/buraksezer/consistent v1.0.0, keys and virtual
// nodes hashed with xxhash64, member names suffixed with a NUL byte, and
// replicas taken by walking the ring. Two nodes compute the same Table from the
// same members and Config only if they report the same AlgorithmVersion, so a
// node publishes it in its metadata and refuses to join a cluster that reports
// another. Any change to placement changes this string.
const AlgorithmVersion = "consistent-v1.0.0/xxhash64/1"

// Limits enforced by Config.Validate and New. They keep a hostile or mistaken
// input from exhausting memory; real deployments are far below them.
const (
	// MaxPartitions is the largest allowed Config.Partitions.
	MaxPartitions = 1 << 20
	// MaxVirtualNodes is the largest allowed Config.VirtualNodes.
	MaxVirtualNodes = 10000
	// MaxRingSize is the largest allowed number of members times
	// Config.VirtualNodes (the number of points on the hash ring).
	MaxRingSize = 1 << 22
	// MaxMemberNameLen is the longest allowed member name, in bytes.
	MaxMemberNameLen = 512
)

// Errors returned by Config.Validate and New. Returned errors wrap one of
// these; test with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("ring: invalid config")
	// ErrNoMembers: the member set is empty.
	ErrNoMembers = errors.New("ring: no members")
	// ErrTooManyMembers: more ring points (members times virtual nodes)
	// than MaxRingSize.
	ErrTooManyMembers = errors.New("ring: too many members")
	// ErrInvalidMember: a member name is empty, longer than
	// MaxMemberNameLen, or contains a NUL byte.
	ErrInvalidMember = errors.New("ring: invalid member name")
	// ErrDuplicateMember: a member name appears more than once.
	ErrDuplicateMember = errors.New("ring: duplicate member name")
)

// Config controls how partitions are placed. Every node of a cluster must use
// the same Config: it is part of Table.Fingerprint. The zero Config is invalid;
// start from DefaultConfig.
type Config struct {
	// Partitions is the number of partitions the key space is split into.
	// A key belongs to partition xxhash64(key) mod Partitions, so changing
	// it remaps almost every key: choose it once, well above the largest
	// member count you expect (a prime spreads keys evenly). More partitions
	// give finer balance and smaller moves, at the cost of more per-partition
	// state (leases, tokens) in the layers above. Default 271.
	Partitions int

	// VirtualNodes is the number of points each member has on the hash
	// ring. More points bring each member's natural share closer to the
	// average, so fewer partitions spill over the load bound and a join or
	// leave moves closer to the ideal fraction of partitions; the cost is
	// build time and memory linear in members × VirtualNodes. At 10 members
	// and Load 1.25, 20 points move about 1.16x the ideal, 200 points about
	// 1.06x, and more points gain little. Default 200.
	VirtualNodes int

	// Load is the load bound: no member owns more than
	// ceil(Partitions/members × Load) partitions. It must be at least 1.
	// A lower bound balances more tightly but makes more partitions spill
	// past their natural owner, and spilled partitions are the ones that move
	// beyond the ideal fraction on a membership change. Default 1.25: at 271
	// partitions and 10 members the bound is ceil(27.1 × 1.25) = 34
	// partitions (1.255x the average); 1.2 would lower it to 33 (1.22x) at
	// the price of about 1.08x the ideal movement instead of 1.06x.
	Load float64
}

// DefaultConfig returns the recommended Config: 271 partitions, 200 virtual
// nodes per member, load bound 1.25. At 10 members a join or leave moves about
// 1.06x the ideal fraction of partitions and the busiest member owns on
// average 1.24x the average load (see the package documentation).
func DefaultConfig() Config {
	return Config{Partitions: 271, VirtualNodes: 200, Load: 1.25}
}

// Validate reports whether c is usable, without changing it. The error wraps
// ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return fmt.Errorf("%w: Partitions %d not in [1, %d]", ErrInvalidConfig, c.Partitions, MaxPartitions)
	case c.VirtualNodes < 1 || c.VirtualNodes > MaxVirtualNodes:
		return fmt.Errorf("%w: VirtualNodes %d not in [1, %d]", ErrInvalidConfig, c.VirtualNodes, MaxVirtualNodes)
	case !(c.Load >= 1) || math.IsInf(c.Load, 1):
		return fmt.Errorf("%w: Load %v must be finite and at least 1", ErrInvalidConfig, c.Load)
	}
	return nil
}

// maxLoad is the most partitions one of n members may own. It is computed
// exactly as consistent v1.0.0 computes its average load, so that placement
// matches it bit for bit.
func (c Config) maxLoad(n int) float64 {
	return math.Ceil(float64(c.Partitions) / float64(n) * c.Load)
}
