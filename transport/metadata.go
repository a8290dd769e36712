package transport

import (
	"context"
	"fmt"

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

// checkKey applies decodeKey's rules to a key about to be sent.
func checkKey(key []byte) error {
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

// WithToken returns a context whose calls through the token client
// interceptors carry t, whatever lease the context may also carry.
func WithToken(ctx context.Context, t ownership.Token) context.Context {
	return context.WithValue(ctx, tokenCtx{}, t)
}

// tokenForCall returns the token an outgoing call made with ctx should
// carry: WithToken's, else the lease's (LeaseFrom), else the one a
// TokenGuard admitted for the call being served (TokenFrom).
func tokenForCall(ctx context.Context) (ownership.Token, bool) {
	if t, ok := ctx.Value(tokenCtx{}).(ownership.Token); ok {
		return t, true
	}
	if l, ok := LeaseFrom(ctx); ok {
		return l.Token(), true
	}
	return TokenFrom(ctx)
}

// callKey returns the routing key of a call a Router makes with ctx: the
// one WithKey set, checked by checkKey.
func callKey(ctx context.Context) ([]byte, error) {
	key, ok := KeyFrom(ctx)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "tenure: the call's context has no routing key (use transport.WithKey)")
	}
	return key, checkKey(key)
}
