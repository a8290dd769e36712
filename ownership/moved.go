package ownership

import "github.com/tenure-go/tenure/ownership/quorum"

// Names that moved out of this package keep an alias here for old callers.
// The state machine's names (Machine, Action, Phase, View, ...) moved to
// package ownership/machine without one: that package imports this one, so
// this one can't name it.

// Stable is quorum.Stable.
//
// Deprecated: use quorum.Stable (package ownership/quorum).
type Stable = quorum.Stable

// StableID is quorum.StableID.
//
// Deprecated: use quorum.StableID (package ownership/quorum).
type StableID = quorum.StableID

// NewStable is quorum.NewStable.
//
// Deprecated: use quorum.NewStable (package ownership/quorum).
func NewStable(v uint64, members []string) Stable { return quorum.NewStable(v, members) }

// MaxStableJump is quorum.MaxStableJump.
//
// Deprecated: use quorum.MaxStableJump (package ownership/quorum).
const MaxStableJump = quorum.MaxStableJump
