package transport

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// Metadata keys tenure reads and writes. Clients in other languages set
// them by hand.
const (
	// KeyMetadata carries the call's routing key, as binary metadata (gRPC
	// base64-encodes "-bin" values on the wire). Exactly one value.
	KeyMetadata = "tenure-key-bin"
	// TokenMetadata carries a fencing token in its text form
	// (ownership.Token.MarshalText). Exactly one value.
	TokenMetadata = "tenure-token"
)

// MaxKeySize is the longest routing key a call may carry, in bytes.
const MaxKeySize = 4096

type keyCtx struct{}

// WithKey returns a context whose calls through a Router go to the owner of
// key. The key is not copied: don't change it while calls use it.
func WithKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// KeyFrom returns the key set by WithKey.
func KeyFrom(ctx context.Context) ([]byte, bool) {
	k, ok := ctx.Value(keyCtx{}).([]byte)
	return k, ok
}

// KeyFromMetadata returns the routing key md carries. It fails with an
// InvalidArgument status when the key is missing, empty, repeated or longer
// than MaxKeySize.
func KeyFromMetadata(md metadata.MD) ([]byte, error) {
	return decodeKey(md.Get(KeyMetadata))
}

func decodeKey(vals []string) ([]byte, error) {
	switch {
	case len(vals) == 0:
		return nil, status.Error(codes.InvalidArgument, "tenure: the call carries no routing key (metadata "+KeyMetadata+")")
	case len(vals) > 1:
		return nil, status.Errorf(codes.InvalidArgument, "tenure: the call carries %d routing keys, want 1", len(vals))
	case len(vals[0]) == 0:
		return nil, status.Error(codes.InvalidArgument, "tenure: the call's routing key is empty")
	case len(vals[0]) > MaxKeySize:
		return nil, status.Errorf(codes.InvalidArgument, "tenure: the call's routing key is %d bytes, at most %d", len(vals[0]), MaxKeySize)
	}
	return []byte(vals[0]), nil
}

// KeyFromIncoming returns the routing key of the call being served with
// ctx (its incoming metadata), with KeyFromMetadata's checks.
func KeyFromIncoming(ctx context.Context) ([]byte, error) {
	return decodeKey(metadata.ValueFromIncomingContext(ctx, KeyMetadata))
}

// CheckKey applies KeyFromMetadata's rules to a key about to be sent: an
// empty key or one longer than MaxKeySize is an InvalidArgument status.
func CheckKey(key []byte) error {
	switch {
	case len(key) == 0:
		return status.Error(codes.InvalidArgument, "tenure: empty routing key (use WithKey)")
	case len(key) > MaxKeySize:
		return status.Errorf(codes.InvalidArgument, "tenure: routing key is %d bytes, at most %d", len(key), MaxKeySize)
	}
	return nil
}

// TokenFromMetadata returns the fencing token md carries; ok is false when
// it carries none. A repeated, oversized or malformed token is an
// InvalidArgument status. The MAC is not verified here.
func TokenFromMetadata(md metadata.MD) (t ownership.Token, ok bool, err error) {
	return decodeToken(md.Get(TokenMetadata))
}

// TokenFromIncoming is TokenFromMetadata for the call being served with
// ctx.
func TokenFromIncoming(ctx context.Context) (t ownership.Token, ok bool, err error) {
	return decodeToken(metadata.ValueFromIncomingContext(ctx, TokenMetadata))
}

func decodeToken(vals []string) (ownership.Token, bool, error) {
	switch {
	case len(vals) == 0:
		return ownership.Token{}, false, nil
	case len(vals) > 1:
		return ownership.Token{}, false, status.Errorf(codes.InvalidArgument, "tenure: the call carries %d tokens, want 1", len(vals))
	case len(vals[0]) > ownership.MaxTokenTextSize:
		return ownership.Token{}, false, status.Errorf(codes.InvalidArgument, "tenure: token is %d bytes, at most %d", len(vals[0]), ownership.MaxTokenTextSize)
	}
	t, err := ownership.ParseTokenText(vals[0])
	if err != nil {
		return ownership.Token{}, false, status.Error(codes.InvalidArgument, err.Error())
	}
	return t, true, nil
}

// AppendToken returns ctx with t added to its outgoing metadata, for a call
// to a resource server guarded by a TokenGuard. Calls made with a lease's
// context through TokenUnaryClientInterceptor get the token on their own.
func AppendToken(ctx context.Context, t ownership.Token) (context.Context, error) {
	text, err := t.MarshalText()
	if err != nil {
		return ctx, fmt.Errorf("tenure: token %v: %w", t, err)
	}
	return metadata.AppendToOutgoingContext(ctx, TokenMetadata, string(text)), nil
}

type tokenCtx struct{}

// WithToken returns a context whose outgoing calls through the token client
// interceptors (TokenUnaryClientInterceptor) carry t. The guards of
// packages routing and resource put the token of the call they let through
// in the handler's context this way, so a handler's calls to a resource
// carry its lease's token; a WithToken of the handler's own overrides it.
func WithToken(ctx context.Context, t ownership.Token) context.Context {
	return context.WithValue(ctx, tokenCtx{}, t)
}

// TokenFromContext returns the token set by WithToken.
func TokenFromContext(ctx context.Context) (ownership.Token, bool) {
	t, ok := ctx.Value(tokenCtx{}).(ownership.Token)
	return t, ok
}

// DefaultExempt exempts gRPC's health and reflection services and tenure's
// ownership service from the guards: they answer for the node, not for a
// key, and need no token.
func DefaultExempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.") ||
		strings.HasPrefix(fullMethod, "/tenure.ownership.v1.Ownership/")
}
