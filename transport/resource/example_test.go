package resource_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/resource"
)

// A resource server checks the tokens calls carry, and runs each handler
// inside the fence's Do, so its writes are atomic with the check. Callers
// attach their lease's token with the client interceptors.
func ExampleNewTokenGuard() {
	fence, err := ownership.NewMemoryFence(271)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := resource.NewTokenGuard(resource.TokenGuardConfig{
		Fence: fence, // judged in Exact mode: writers fence first
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	defer srv.Stop()
	// pb.RegisterStoreServer(srv, store): handlers write under
	// resource.TokenFrom(ctx), before they return.

	// A caller's dial options:
	_ = []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(transport.TokenUnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(transport.TokenStreamClientInterceptor()),
	}

	// What the guard's fence does with the calls' tokens: a newer owner
	// fences, and the older token is refused from then on.
	ctx := context.Background()
	e1 := ownership.Token{Partition: 7, Epoch: 1, Owner: "node-1", Incarnation: 1}
	e2 := ownership.Token{Partition: 7, Epoch: 2, Owner: "node-2", Incarnation: 1}
	_, _ = fence.Fence(ctx, e1)
	fmt.Println("write under e1:", fence.Do(ctx, e1, ownership.Exact, func() error { return nil }))
	_, _ = fence.Fence(ctx, e2)
	_, stale := transport.StaleFromStatus(transport.StatusFromError(fence.Do(ctx, e1, ownership.Exact, func() error { return nil })))
	fmt.Println("write under e1 after e2's fence refused as stale:", stale)
	// Output:
	// write under e1: <nil>
	// write under e1 after e2's fence refused as stale: true
}
