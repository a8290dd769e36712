package routing_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/ownershippb"
	"github.com/tenure-go/tenure/transport/routing"
)

// startNode starts a one-node cluster whose coordinator gossips the
// address lis listens at.
func startNode(ctx context.Context, lis net.Listener) (*coordinator.Coordinator, error) {
	cfg := coordinator.LocalConfig()
	cfg.Name = "node-1"
	cfg.ServiceAddr = lis.Addr().String()
	cfg.Ring.Partitions = 8
	cfg.Handler = coordinator.HandlerFuncs{}
	c, err := coordinator.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, c.WaitConverged(ctx)
}

// A node: listen, gossip the address, guard the server with the
// coordinator, serve health and the ownership service beside the
// application's own services; to stop, leave (health turns NOT_SERVING
// first), then stop serving.
func ExampleNewGuard() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	c, err := startNode(ctx, lis)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	guard, err := routing.NewGuard(routing.GuardConfig{Leases: c, Stale: c})
	if err != nil {
		log.Fatal(err)
	}
	ka := transport.DefaultKeepalive()
	srv := grpc.NewServer(append(guard.ServerOptions(), ka.ServerOptions()...)...)
	health := routing.NewHealth(c)
	health.Register(srv)
	svc, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: c})
	if err != nil {
		log.Fatal(err)
	}
	svc.Register(srv)
	// pb.RegisterYourServiceServer(srv, yourServer): handlers call
	// routing.LeaseFrom(ctx) and write under the lease's token.
	go func() { _ = srv.Serve(lis) }()

	status := func() healthgrpc.HealthCheckResponse_ServingStatus {
		resp, _ := health.Check(ctx, &healthgrpc.HealthCheckRequest{})
		return resp.GetStatus()
	}
	fmt.Println("serving:", status())
	// Shutting down: hand the partitions off, then stop serving.
	if err := c.Leave(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after Leave:", status())
	srv.GracefulStop()
	health.Close()
	// Output:
	// serving: SERVING
	// after Leave: NOT_SERVING
}

// A client: route each call by its key. Generated clients take the router
// where they take a *grpc.ClientConn; here the call is the ownership
// service's Lookup, sent to the key's owner, which names itself.
func ExampleNewRouter() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	c, err := startNode(ctx, lis) // the process's coordinator
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	srv := grpc.NewServer()
	svc, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: c})
	if err != nil {
		log.Fatal(err)
	}
	svc.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ka := transport.DefaultKeepalive()
	r, err := routing.NewRouter(routing.RouterConfig{
		Owners:      c,
		Membership:  c,
		DialOptions: append(ka.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials())),
		// Reads are safe to retry; a write needs a request id for that
		// (transport.WithRequestID).
		Idempotent: func(method string) bool { return method == ownershippb.Ownership_Lookup_FullMethodName },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	key := []byte("user-42")
	resp, err := ownershippb.NewOwnershipClient(r).Lookup(transport.WithKey(ctx, key), &ownershippb.LookupRequest{Key: key})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("answered by the owner,", resp.GetOwner())
	// Output: answered by the owner, node-1
}
