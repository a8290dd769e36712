package machine

// TestingKnobs re-introduce defects this project has had, one switch each,
// so that tenure's own test suites can prove they catch them (negative
// controls). They exist for those tests only: never set them in a program.
// The zero value, and a nil pointer, change nothing.
type TestingKnobs struct {
	// SkipFence makes the machine serve a new lease without fencing the
	// resource first (S2 broken).
	SkipFence bool
	// StableFromFirstView makes a node that knows no stable membership take
	// its own first view as one and ignore the stable memberships other
	// nodes gossip, so a node restarted on the minority side of a split
	// counts a quorum at once.
	StableFromFirstView bool
	// NoClaimBackoff makes a failed claim retry on the next tick, forever.
	NoClaimBackoff bool
	// HalfIsQuorum counts half of the stable membership as a quorum.
	HalfIsQuorum bool
	// NoStepDown keeps every lease when the quorum is lost (L4 broken).
	NoStepDown bool
	// ForgetFencedView drops the no-duel rule (L5): a node fenced out by a
	// live rival claims again at once.
	ForgetFencedView bool
}
