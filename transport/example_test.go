package transport_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// A node: listen, gossip the address, guard the server with the
// coordinator, serve health and the ownership service beside the
// application's own services.
func ExampleNewGuard() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = "node-1"
	cfg.ServiceAddr = lis.Addr().String()
	cfg.Handler = coordinator.HandlerFuncs{}
	c, err := coordinator.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		log.Fatal(err)
	}

	guard, err := transport.NewGuard(transport.GuardConfig{Leases: c})
	if err != nil {
		log.Fatal(err)
	}
	ka := transport.DefaultKeepalive()
	srv := grpc.NewServer(append(guard.ServerOptions(), ka.ServerOptions()...)...)
	health := transport.NewHealth(c)
	health.Register(srv)
	svc, err := transport.NewOwnershipService(transport.OwnershipServiceConfig{Source: c})
	if err != nil {
		log.Fatal(err)
	}
	svc.Register(srv)
	// pb.RegisterYourServiceServer(srv, yourServer): handlers call
	// transport.LeaseFrom(ctx) and write under the lease's token.
	go func() { _ = srv.Serve(lis) }()

	// Shutting down: hand the partitions off, then stop serving.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.Leave(ctx)
	srv.GracefulStop()
	health.Close()
}

// A client: route each call by its key. Generated clients take the router
// where they take a *grpc.ClientConn.
func ExampleNewRouter() {
	var c *coordinator.Coordinator // the process's started coordinator
	ka := transport.DefaultKeepalive()
	r, err := transport.NewRouter(transport.RouterConfig{
		Owners:      c,
		DialOptions: append(ka.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials())),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// client := pb.NewYourServiceClient(r); client.Put(transport.WithKey(ctx, key), req)
	var reply wrapperspb.StringValue
	err = r.Invoke(transport.WithKey(ctx, []byte("user-42")), "/your.Service/Put", wrapperspb.Bytes(nil), &reply)
	if err != nil {
		log.Print(status.Code(err), err)
	}
}

// A not-owner refusal names the owner; a client follows it.
func ExampleOwnerHint() {
	err := transport.NotOwnerStatus(ownership.OwnerInfo{
		Partition: 7,
		Node:      "node-2",
		Addr:      "10.0.0.2:7000",
		Token:     ownership.Token{Partition: 7, Epoch: 3, Owner: "node-2", Incarnation: 1},
	})
	fmt.Println(status.Code(err))
	if o, ok := transport.OwnerHint(err); ok {
		fmt.Println(o.Node, o.Addr, o.Token.Epoch)
	}
	// Output:
	// FailedPrecondition
	// node-2 10.0.0.2:7000 3
}

// A resource's stale refusal carries its current token, which a node's
// coordinator takes to step down.
func ExampleStaleFromStatus() {
	mine := ownership.Token{Partition: 1, Epoch: 4, Owner: "node-1", Incarnation: 9}
	theirs := ownership.Token{Partition: 1, Epoch: 5, Owner: "node-2", Incarnation: 2}
	err := transport.StatusFromError(ownership.Stale(mine, theirs))

	if st, ok := transport.StaleFromStatus(err); ok {
		fmt.Println(status.Code(err), st.Current.Owner, st.Current.Epoch)
		// coord.ReportStale(st)
	}
	// Output: FailedPrecondition node-2 5
}

// Resource servers check the tokens calls carry.
func ExampleNewTokenGuard() {
	fence, err := ownership.NewMemoryFence(271)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := transport.NewTokenGuard(transport.TokenGuardConfig{
		Checker: transport.FenceChecker(fence),
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	defer srv.Stop()

	// Callers attach their lease's token with the client interceptor.
	_ = []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(transport.TokenUnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(transport.TokenStreamClientInterceptor()),
	}
}

// Servers must accept the clients' keepalive pings.
func ExampleKeepalive() {
	k := transport.DefaultKeepalive()
	fmt.Println(k.Validate())
	k.ClientTime = 10 * time.Second // faster than the servers' MinTime
	fmt.Println(k.Validate())
	// Output:
	// <nil>
	// transport: Keepalive.ClientTime is below ServerMinTime: servers would close the clients' connections
}
