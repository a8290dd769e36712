package transport

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details tenure
// attaches to the statuses it returns. The reasons below tell them apart;
// the metadata keys are listed with each reason.
const ErrorDomain = "tenure"

// ErrorInfo reasons.
const (
	// ReasonNotOwner, with FailedPrecondition: the answering node does not
	// own the key's partition. Metadata: "partition", "owner" (node name),
	// "address" (its service address, may be empty), "epoch" (decimal, 0
	// while the owner has not claimed yet) and "token" (text form, absent
	// while the owner has not claimed yet).
	ReasonNotOwner = "NOT_OWNER"
	// ReasonHandoff, with Unavailable: the ring gives the partition to the
	// answering node but it holds no lease on it (it is being handed over,
	// or the lease ended during the call). Retry after a pause. Metadata:
	// "partition", "owner".
	ReasonHandoff = "HANDOFF"
	// ReasonStaleToken, with FailedPrecondition: the resource has accepted
	// a higher token. Metadata: "partition", "token" (the rejected one),
	// "current_token", "current_owner", "current_epoch".
	ReasonStaleToken = "STALE_TOKEN"
	// ReasonNotFenced, with FailedPrecondition: the token is above the
	// resource's mark in an Exact check: its owner must fence first.
	// No metadata.
	ReasonNotFenced = "NOT_FENCED"
	// ReasonOutcomeUnknown, with Unknown: the call may have been applied
	// (a commit whose answer was lost, a connection that broke or a
	// deadline that passed after the request was sent). It is neither
	// success nor failure: retrying it may apply it twice, unless it
	// carries a request id the server deduplicates (RequestIDMetadata).
	// Metadata: "address", the node the call was sent to, if known.
	ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"
)

// Limits on the hints decoded from a status, so a bad peer can't make a
// client keep or dial absurd values.
const (
	maxHintAddr = 512
	// maxHintOwner is the longest "owner" a not-owner detail may carry: an
	// owner name of ownership.MaxOwnerSize bytes, each replaced by U+FFFD
	// (3 bytes) if it is not UTF-8.
	maxHintOwner = 3 * ownership.MaxOwnerSize
)

// Limits on the text a status carries: its message, and each value of its
// detail's metadata (an unknown outcome's reason among them).
const (
	maxMessage = 4096
	maxReason  = 1024
)

func errorInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: md}
}

// withInfo returns a status error with code c, message msg and info as its
// only detail (see newStatus).
func withInfo(c codes.Code, msg string, info *errdetails.ErrorInfo) error {
	return newStatus(c, msg, info).Err()
}

// newStatus returns a status with code c, message msg and info as its only
// detail, built to survive the wire: protobuf refuses strings that are not
// UTF-8, and grpc-go, unable to marshal the status, then sends it without
// any detail (and a client can't classify it). So the message and every
// metadata value are made valid UTF-8 and bounded (wireString). Should the
// detail still not marshal, the status keeps a detail with the reason
// alone, which still classifies it (an unknown outcome stays one).
func newStatus(c codes.Code, msg string, info *errdetails.ErrorInfo) *status.Status {
	clean := &errdetails.ErrorInfo{Reason: wireString(info.GetReason(), maxReason), Domain: ErrorDomain}
	if md := info.GetMetadata(); len(md) > 0 {
		clean.Metadata = make(map[string]string, len(md))
		for k, v := range md {
			clean.Metadata[wireString(k, maxReason)] = wireString(v, maxReason)
		}
	}
	s := status.New(c, wireString(msg, maxMessage))
	if d, err := s.WithDetails(clean); err == nil {
		return d
	}
	if d, err := s.WithDetails(errorInfo(clean.Reason, nil)); err == nil {
		return d
	}
	return s
}

// wireString returns s as a status may carry it: valid UTF-8 (each invalid
// byte sequence replaced by U+FFFD), cut at a character boundary to at
// most n bytes.
func wireString(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func tokenText(t ownership.Token) string {
	if t.IsZero() {
		return ""
	}
	b, err := t.MarshalText()
	if err != nil {
		return ""
	}
	return string(b)
}

// NotOwnerStatus returns the FailedPrecondition status a node answers with
// for a key whose partition owner is described by o.
func NotOwnerStatus(o ownership.OwnerInfo) error {
	md := map[string]string{
		"partition": strconv.FormatUint(uint64(o.Partition), 10),
		"owner":     o.Node,
		"address":   o.Addr,
		"epoch":     strconv.FormatUint(o.Token.Epoch, 10),
	}
	if t := tokenText(o.Token); t != "" {
		md["token"] = t
	}
	return withInfo(codes.FailedPrecondition,
		"tenure: not the owner of partition "+md["partition"]+": "+o.Node+" at "+o.Addr+" owns it",
		errorInfo(ReasonNotOwner, md))
}

// HandoffStatus returns the Unavailable status with a ReasonHandoff detail
// a node answers for partition p when the ring gives it to the node (self)
// but it holds no lease on it, or its lease ended before the call was
// applied: nothing was applied; retry after a pause.
func HandoffStatus(p uint32, self string) error {
	ps := strconv.FormatUint(uint64(p), 10)
	return withInfo(codes.Unavailable, "tenure: partition "+ps+" is being handed over to "+self,
		errorInfo(ReasonHandoff, map[string]string{"partition": ps, "owner": self}))
}

// StaleStatus returns the FailedPrecondition status for a write rejected
// by a fence, carrying the resource's current token.
func StaleStatus(e *ownership.StaleTokenError) error {
	md := map[string]string{
		"partition":     strconv.FormatUint(uint64(e.Token.Partition), 10),
		"token":         tokenText(e.Token),
		"current_token": tokenText(e.Current),
		"current_owner": e.Current.Owner,
		"current_epoch": strconv.FormatUint(e.Current.Epoch, 10),
	}
	return withInfo(codes.FailedPrecondition, e.Error(), errorInfo(ReasonStaleToken, md))
}

// StatusFromError converts the errors of tenure's packages to gRPC
// statuses, so a handler can return what a fence or the coordinator said:
//
//   - *ownership.StaleTokenError: FailedPrecondition, ReasonStaleToken
//   - *ownership.NotOwnerError: FailedPrecondition, ReasonNotOwner
//   - ownership.ErrNotFenced: FailedPrecondition, ReasonNotFenced
//   - ownership.ErrBadMAC: Unauthenticated
//   - ownership.ErrMalformedToken, ownership.ErrPartitionRange: InvalidArgument
//   - ownership.ErrOutcomeUnknown: Unknown, ReasonOutcomeUnknown (checked
//     first: the write may have committed, whatever else err wraps)
//   - ownership.ErrLeaseEnded, ownership.ErrNoOwner: Unavailable
//   - context errors: Canceled or DeadlineExceeded
//
// A status error, nil, and any other error are returned unchanged.
func StatusFromError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var stale *ownership.StaleTokenError
	var notOwner *ownership.NotOwnerError
	switch {
	case errors.Is(err, ownership.ErrOutcomeUnknown):
		return OutcomeUnknown("", err.Error())
	case errors.As(err, &stale):
		return StaleStatus(stale)
	case errors.As(err, &notOwner):
		return NotOwnerStatus(notOwner.Owner)
	case errors.Is(err, ownership.ErrNotFenced):
		return withInfo(codes.FailedPrecondition, err.Error(), errorInfo(ReasonNotFenced, nil))
	case errors.Is(err, ownership.ErrBadMAC):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, ownership.ErrMalformedToken), errors.Is(err, ownership.ErrPartitionRange):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ownership.ErrLeaseEnded), errors.Is(err, ownership.ErrNoOwner):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return err
}

// info returns the tenure ErrorInfo of a status error, if it has one.
func info(err error) (codes.Code, *errdetails.ErrorInfo) {
	s, ok := status.FromError(err)
	if !ok {
		return codes.Unknown, nil
	}
	for _, d := range s.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			return s.Code(), ei
		}
	}
	return s.Code(), nil
}

// OwnerHint returns the owner named by a ReasonNotOwner status. It reports
// false for any other error and for a detail that does not decode (a bad
// partition, epoch or token, an oversized address or owner).
func OwnerHint(err error) (ownership.OwnerInfo, bool) {
	c, ei := info(err)
	if c != codes.FailedPrecondition || ei == nil || ei.GetReason() != ReasonNotOwner {
		return ownership.OwnerInfo{}, false
	}
	return decodeOwner(ei.GetMetadata())
}

func decodeOwner(md map[string]string) (ownership.OwnerInfo, bool) {
	p, err := strconv.ParseUint(md["partition"], 10, 32)
	if err != nil {
		return ownership.OwnerInfo{}, false
	}
	o := ownership.OwnerInfo{Partition: uint32(p), Node: md["owner"], Addr: md["address"]}
	if o.Node == "" || len(o.Node) > maxHintOwner || len(o.Addr) > maxHintAddr {
		return ownership.OwnerInfo{}, false
	}
	epoch, err := strconv.ParseUint(md["epoch"], 10, 64)
	if err != nil {
		return ownership.OwnerInfo{}, false
	}
	if text := md["token"]; text != "" {
		// The token carries the owner's name exactly; "owner" is its
		// UTF-8 form (the same, but for a name that is not UTF-8).
		t, err := ownership.ParseTokenText(text)
		if err != nil || t.Epoch != epoch || t.Partition != o.Partition || wireString(t.Owner, maxReason) != o.Node {
			return ownership.OwnerInfo{}, false
		}
		o.Node, o.Token = t.Owner, t
	} else if epoch != 0 {
		return ownership.OwnerInfo{}, false
	}
	return o, true
}

// IsHandoff reports whether err is the Unavailable status of a node that
// is taking over or giving up the key's partition (ReasonHandoff).
func IsHandoff(err error) bool {
	c, ei := info(err)
	return c == codes.Unavailable && ei != nil && ei.GetReason() == ReasonHandoff
}

// StaleFromStatus decodes a ReasonStaleToken status back into the fence's
// error, so a caller can hand it to coordinator.ReportStale. It reports
// false for any other error and for tokens that do not decode.
func StaleFromStatus(err error) (*ownership.StaleTokenError, bool) {
	c, ei := info(err)
	if c != codes.FailedPrecondition || ei == nil || ei.GetReason() != ReasonStaleToken {
		return nil, false
	}
	md := ei.GetMetadata()
	var e ownership.StaleTokenError
	for _, f := range []struct {
		key string
		t   *ownership.Token
	}{{"token", &e.Token}, {"current_token", &e.Current}} {
		if text := md[f.key]; text != "" {
			t, err := ownership.ParseTokenText(text)
			if err != nil {
				return nil, false
			}
			*f.t = t
		}
	}
	return &e, true
}
