package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Stable is a stable membership: the member set a node counts its quorum
// against (L4). Nodes gossip it, and it merges by taking the higher ID, so
// a node that restarts, joins, or comes back from the other side of a
// split learns the cluster's stable membership instead of trusting its own
// first view.
//
// The zero Stable (version 0) is "not known yet": a node that holds it has
// no quorum.
type Stable struct {
	// Version counts changes: every node that changes the stable membership
	// takes one above the highest it knows.
	Version uint64
	// Members are the member names, sorted and distinct.
	Members []string
}

// StableID names a stable membership compactly, for node metadata: two
// Stables with the same ID are the same. The zero StableID is the zero
// Stable's.
type StableID struct {
	Version uint64
	Hash    uint64 // of the members; 0 for version 0
}

// Compare orders IDs by version, then by hash, so that two different sets
// made with the same version by nodes that could not hear each other are
// ordered the same way everywhere.
func (a StableID) Compare(b StableID) int {
	if c := cmp.Compare(a.Version, b.Version); c != 0 {
		return c
	}
	return cmp.Compare(a.Hash, b.Hash)
}

func (a StableID) String() string {
	if a.Version == 0 {
		return "v0"
	}
	return fmt.Sprintf("v%d/%04x", a.Version, a.Hash&0xffff)
}

// NewStable returns the stable membership version v of members (copied,
// sorted, duplicates dropped).
func NewStable(v uint64, members []string) Stable {
	ms := slices.Clone(members)
	slices.Sort(ms)
	return Stable{Version: v, Members: slices.Compact(ms)}
}

// ID returns s's ID.
func (s Stable) ID() StableID {
	if s.Version == 0 {
		return StableID{}
	}
	// FNV-1a over each name and a 0 byte after it (hash/fnv's New64a,
	// inlined: no allocation per name; a node hashes its set every tick).
	h := uint64(fnvOffset64)
	for _, m := range s.Members {
		for i := range len(m) {
			h = (h ^ uint64(m[i])) * fnvPrime64
		}
		h *= fnvPrime64 // the 0 byte
	}
	return StableID{Version: s.Version, Hash: h}
}

// FNV-1a's 64-bit parameters.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Known reports whether s is a stable membership at all (version above 0).
func (s Stable) Known() bool { return s.Version > 0 }

// Has reports whether m is a member of s.
func (s Stable) Has(m string) bool {
	_, ok := slices.BinarySearch(s.Members, m)
	return ok
}

func (s Stable) String() string {
	if !s.Known() {
		return "v0{}"
	}
	return fmt.Sprintf("v%d{%s}", s.Version, strings.Join(s.Members, ","))
}

// Valid reports whether s is well formed: sorted, distinct, non-empty
// names of at most MaxMemberSize bytes, and members exactly when the version
// is above 0.
func (s Stable) Valid() bool {
	if s.Version == 0 {
		return len(s.Members) == 0
	}
	if len(s.Members) == 0 {
		return false
	}
	for i, m := range s.Members {
		if m == "" || len(m) > MaxMemberSize || i > 0 && s.Members[i-1] >= m {
			return false
		}
	}
	return true
}

// MaxMemberSize is the longest member name a stable membership holds, in
// bytes: a member is a node, and its name an owner's
// (ownership.MaxOwnerSize; this package imports nothing of ownership, so
// that the core's gossip codec can carry a Stable).
const MaxMemberSize = 255

// MaxStableJump is the most a stable membership heard from the network
// (a message, or the ID in a member's metadata) may raise the version
// above the node's own. A cluster takes one version per membership change:
// 2^32 is more than any real cluster sees, so no single forged message can
// push the version to its end (where Version+1 wraps to "not known").
const MaxStableJump = 1 << 32

// Plausible reports whether id, heard from the network, is within
// MaxStableJump of own.
func Plausible(own, id StableID) bool {
	return id.Version <= own.Version || id.Version-own.Version <= MaxStableJump
}

// Majority reports whether seen (sorted names, the members a node sees)
// holds a quorum of the stable membership: more than half of its members.
// Exactly half is not a quorum, whichever half: a tie-breaker (say, the
// half with the lowest name) would let a half count against a stable set
// that was just grown by a join, while the other side still counts a
// majority of the set before the join (found by the simulator).
func Majority(stable []string, seen []string) bool {
	return len(stable) > 0 && 2*Count(seen, stable) > len(stable)
}

// Count counts the names of sub found in sorted set.
func Count(sub, set []string) int {
	n := 0
	if slices.IsSorted(sub) {
		// A merge of the two: the callers' lists are sorted, and a view
		// is counted on every tick.
		j := 0
		for _, m := range sub {
			for j < len(set) && set[j] < m {
				j++
			}
			if j < len(set) && set[j] == m {
				n++
			}
		}
		return n
	}
	for _, m := range sub {
		if _, found := slices.BinarySearch(set, m); found {
			n++
		}
	}
	return n
}
