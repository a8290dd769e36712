package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// RequestIDMetadata carries a call's request id: a name for one logical
// write, the same on every attempt and retry of it, so the server applies
// it once (see WithRequestID). Exactly one value of 1 to MaxRequestIDSize
// printable ASCII bytes.
const RequestIDMetadata = "tenure-request-id"

// MaxRequestIDSize is the longest request id a call may carry, in bytes.
const MaxRequestIDSize = 128

// NewRequestID returns a fresh random request id (128 bits, 32 hex
// digits). It draws from crypto/rand, so two processes never share one.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// WithRequestID returns ctx with id in its outgoing metadata: the calls
// made with it carry the id, and a server that deduplicates by id (for
// example with sqlfence.Requests) applies the write once, however often the
// call is retried, and answers a retry with the first outcome. A Router
// retries a call with an id after any failure, an unknown outcome
// included. Give each logical write its own id (NewRequestID) and keep it
// for the retries a caller makes itself.
//
// WithRequestID fails with an InvalidArgument status for an id that is
// empty, longer than MaxRequestIDSize or not printable ASCII, or when ctx
// already carries an id.
func WithRequestID(ctx context.Context, id string) (context.Context, error) {
	if err := checkRequestID(id); err != nil {
		return ctx, err
	}
	if len(metadata.ValueFromOutgoingContext(ctx, RequestIDMetadata)) != 0 {
		return ctx, status.Error(codes.InvalidArgument, "tenure: the context carries a request id already")
	}
	return metadata.AppendToOutgoingContext(ctx, RequestIDMetadata, id), nil
}

// RequestIDFromIncoming returns the request id of the call being served
// with ctx, or "" when it carries none. A repeated or malformed id is an
// InvalidArgument status.
func RequestIDFromIncoming(ctx context.Context) (string, error) {
	return decodeRequestID(metadata.ValueFromIncomingContext(ctx, RequestIDMetadata))
}

// RequestIDFromOutgoing returns the request id ctx's outgoing calls carry,
// or "" when they carry none; a repeated or malformed one is an error.
func RequestIDFromOutgoing(ctx context.Context) (string, error) {
	return decodeRequestID(metadata.ValueFromOutgoingContext(ctx, RequestIDMetadata))
}

func decodeRequestID(vals []string) (string, error) {
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		if err := checkRequestID(vals[0]); err != nil {
			return "", err
		}
		return vals[0], nil
	}
	return "", status.Errorf(codes.InvalidArgument, "tenure: the call carries %d request ids, want 1", len(vals))
}

func checkRequestID(id string) error {
	if id == "" || len(id) > MaxRequestIDSize {
		return status.Errorf(codes.InvalidArgument, "tenure: a request id is 1 to %d bytes, not %d", MaxRequestIDSize, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return status.Errorf(codes.InvalidArgument, "tenure: request id %q: want printable ASCII without spaces", id)
		}
	}
	return nil
}
