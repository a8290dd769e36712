package transport

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TokenUnaryClientInterceptor returns a client interceptor that sends the
// call's token (WithToken; inside a guarded handler, the token of the call
// being served) in TokenMetadata, for a resource server guarded by
// resource.TokenGuard. A call with no token is sent as it is.
func TokenUnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, err := withCallToken(ctx)
		if err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// TokenStreamClientInterceptor is TokenUnaryClientInterceptor for streams.
func TokenStreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := withCallToken(ctx)
		if err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

func withCallToken(ctx context.Context) (context.Context, error) {
	t, ok := TokenFromContext(ctx)
	if !ok {
		return ctx, nil
	}
	ctx, err := AppendToken(ctx, t)
	if err != nil {
		return ctx, status.Error(codes.InvalidArgument, err.Error())
	}
	return ctx, nil
}
