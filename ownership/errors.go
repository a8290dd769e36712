package ownership

import (
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership/internal/wire"
)

// Sentinel errors. Test for them with errors.Is: the errors returned carry
// more detail (see StaleTokenError).
var (
	// ErrStaleToken: the resource has already accepted or fenced a higher
	// token for the partition. The writer is no longer the owner.
	ErrStaleToken = errors.New("tenure: stale token")
	// ErrBadMAC: the token's MAC does not verify under any cluster key.
	ErrBadMAC = errors.New("tenure: token authentication failed")
	// ErrMalformedToken: bytes or text that do not decode to a token, a
	// claim or a gossip register; or a token that can't be encoded.
	ErrMalformedToken = wire.ErrMalformed
	// ErrNotFenced: an Exact check saw a token above the partition's mark:
	// its owner writes without having fenced the resource first. The writer
	// should fence, then retry.
	ErrNotFenced = errors.New("tenure: token not fenced")
	// ErrLeaseEnded: the lease was revoked or released; its token may
	// already be fenced out.
	ErrLeaseEnded = errors.New("tenure: lease ended")
	// ErrConflict: an authority's conditional claim lost a race with another
	// claimant; the caller may retry with what it has now seen.
	ErrConflict = errors.New("tenure: concurrent claim")
	// ErrPartitionRange: a partition number outside what the fence or
	// authority was built for.
	ErrPartitionRange = errors.New("tenure: partition out of range")
	// ErrOutcomeUnknown: a write may or may not have been applied (its
	// commit was sent but the answer was lost, or the deadline passed
	// mid-commit). It is neither success nor failure: retrying it is a
	// second write unless the write carries a request id the resource
	// deduplicates. An error wrapping it never also wraps
	// context.Canceled or context.DeadlineExceeded, so it is not mistaken
	// for "nothing happened".
	ErrOutcomeUnknown = errors.New("tenure: outcome unknown")
)

// ConflictError is returned by an Authority's Claim when the partition's
// mark is not the one the claimant saw: another claim (or a fence) won.
// Current is what the claimant missed, perhaps a claim whose gossip never
// reached it: the next claim goes above it. errors.Is(err, ErrConflict)
// holds.
type ConflictError struct {
	Partition uint32 // the partition claimed
	Seen      Token  // what the claimant passed as seen
	Current   Token  // the mark found instead (zero if unknown)
}

func (e *ConflictError) Error() string {
	if e.Current.IsZero() {
		return fmt.Sprintf("tenure: claim of p%d above epoch %d lost", e.Partition, e.Seen.Epoch)
	}
	return fmt.Sprintf("tenure: claim of p%d above epoch %d lost: mark is %v", e.Partition, e.Seen.Epoch, e.Current)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// StaleTokenError is returned when a token is lower than the partition's
// high-water mark at the resource. It carries both, so the former owner
// learns who holds the partition now. errors.Is(err, ErrStaleToken) holds.
type StaleTokenError struct {
	Token   Token // the token that was rejected
	Current Token // the partition's high-water mark at the resource
}

func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("tenure: stale token %v: resource holds %v", e.Token, e.Current)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Stale builds the error for token t rejected in favour of current.
func Stale(t, current Token) error { return &StaleTokenError{Token: t, Current: current} }

// NotFencedError is returned when a token is above the partition's mark
// at the resource: its owner writes without having fenced (Exact), or the
// resource lost the fence (a table reset or restored from a backup).
// errors.Is(err, ErrNotFenced) holds. Pass it to the coordinator's
// ReportStale: the lease ends and a new one is fenced.
type NotFencedError struct {
	Token   Token // the token that was refused
	Current Token // the partition's mark at the resource (zero if none)
	// Mark is Current, under its old name.
	//
	// Deprecated: use Current, the name StaleTokenError and ConflictError
	// give the mark too.
	Mark Token
}

func (e *NotFencedError) Error() string {
	return fmt.Sprintf("%v: %v is above the mark %v", ErrNotFenced, e.Token, e.Current)
}

// Is makes errors.Is(err, ErrNotFenced) true.
func (e *NotFencedError) Is(target error) bool { return target == ErrNotFenced }

// Why a lease ended: the cause of its context (context.Cause), and of
// the machine's ActEnd and ActRelease. Each wraps ErrLeaseEnded.
var (
	// ErrLeaseReleased: the lease was handed off (the ring moved the
	// partition, or the node left) after the handler drained.
	ErrLeaseReleased = fmt.Errorf("%w: released", ErrLeaseEnded)
	// ErrLeaseResigned: the node gave the lease back (Resign, or the
	// handler ended it).
	ErrLeaseResigned = fmt.Errorf("%w: resigned", ErrLeaseEnded)
	// ErrLeaseSuperseded: a higher token exists for the partition (heard by
	// gossip, or reported by a fence that rejected a write).
	ErrLeaseSuperseded = fmt.Errorf("%w: superseded", ErrLeaseEnded)
	// ErrLeaseNoQuorum: the node could not see a quorum for StepDown (L4).
	ErrLeaseNoQuorum = fmt.Errorf("%w: no quorum", ErrLeaseEnded)
	// ErrLeaseNotFenced: the resource's mark fell below the lease's token (a
	// fence table reset or restored): the handler's view of the resource
	// may be stale, so the lease ends and a new one is fenced.
	ErrLeaseNotFenced = fmt.Errorf("%w: fence lost", ErrLeaseEnded)
	// ErrLeaseTimeout: the handler's Acquire or Release overran its
	// deadline.
	ErrLeaseTimeout = fmt.Errorf("%w: handler timed out", ErrLeaseEnded)
	// ErrLeaseFailed: fencing the resource, or the handler's Acquire after
	// it, failed (its message says both, as it is either).
	ErrLeaseFailed = fmt.Errorf("%w: fence or acquire failed", ErrLeaseEnded)
)
