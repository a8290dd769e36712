package transport

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// OutcomeUnknownError reports a call that may or may not have been
// applied: a commit whose answer was lost, or a connection that broke, a
// deadline that passed or an owner that left while the request was on its
// way or being served. It is neither success nor failure: retrying the call
// may apply it twice, unless it carries a request id the server
// deduplicates (WithRequestID). Read back, or retry with the same id, to
// learn the outcome.
//
// errors.Is(err, ownership.ErrOutcomeUnknown) holds, and no context error
// is wrapped (a caller must not take it for "cancelled, nothing
// happened"). It is a gRPC status (codes.Unknown with a
// ReasonOutcomeUnknown detail), so a server that returns it passes it on
// as it is, and IsOutcomeUnknown recognises it after the hop.
type OutcomeUnknownError struct {
	// Addr is the node the call was sent to, if known.
	Addr string
	// Reason says what happened, in words (the last error's text).
	Reason string
}

// OutcomeUnknown returns an *OutcomeUnknownError for a call sent to addr
// ("" if unknown) that ended as reason says.
func OutcomeUnknown(addr, reason string) error {
	return &OutcomeUnknownError{Addr: addr, Reason: reason}
}

func (e *OutcomeUnknownError) Error() string {
	msg := "tenure: outcome unknown"
	if e.Addr != "" {
		msg += " (sent to " + e.Addr + ")"
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is makes errors.Is(err, ownership.ErrOutcomeUnknown) true.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ownership.ErrOutcomeUnknown }

// GRPCStatus returns the error as a status, for gRPC and status.FromError.
// The status survives the wire whatever the error's text: the reason goes
// in the detail as valid UTF-8, cut at a character boundary to at most
// 1024 bytes, and an address longer than a hint may be is left out.
func (e *OutcomeUnknownError) GRPCStatus() *status.Status {
	sent := &OutcomeUnknownError{Reason: wireString(e.Reason, maxReason)}
	if addr := wireString(e.Addr, maxHintAddr+1); len(addr) <= maxHintAddr {
		sent.Addr = addr
	}
	md := map[string]string{"reason": sent.Reason}
	if sent.Addr != "" {
		md["address"] = sent.Addr
	}
	return newStatus(codes.Unknown, sent.Error(), errorInfo(ReasonOutcomeUnknown, md))
}

// AsOutcomeUnknown returns err as an *OutcomeUnknownError: the one err is
// or wraps, or one decoded from a ReasonOutcomeUnknown status that crossed
// the network. It reports false for any other error, including other
// errors that wrap ownership.ErrOutcomeUnknown (IsOutcomeUnknown accepts
// those too).
func AsOutcomeUnknown(err error) (*OutcomeUnknownError, bool) {
	var e *OutcomeUnknownError
	if errors.As(err, &e) {
		return e, true
	}
	c, ei := info(err)
	if c != codes.Unknown || ei == nil || ei.GetReason() != ReasonOutcomeUnknown {
		return nil, false
	}
	md := ei.GetMetadata()
	addr := md["address"]
	if len(addr) > maxHintAddr {
		addr = ""
	}
	return &OutcomeUnknownError{Addr: addr, Reason: wireString(md["reason"], maxReason)}, true
}

// IsOutcomeUnknown reports whether err says a call may have been applied:
// an error wrapping ownership.ErrOutcomeUnknown, or its status after a hop.
func IsOutcomeUnknown(err error) bool {
	if errors.Is(err, ownership.ErrOutcomeUnknown) {
		return true
	}
	_, ok := AsOutcomeUnknown(err)
	return ok
}
