package ownershippb_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/transport/ownershippb"
	"github.com/tenure-go/tenure/transport/routing"
)

// A client asks a node which node owns a key, and where to reach it. The
// answer is the node's view: the owner may change right after, and the
// resource's fence is what rejects a write under an old token. Here the
// node is a one-node cluster serving routing.NewOwnershipService.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = "node-1"
	cfg.ServiceAddr = lis.Addr().String()
	cfg.Ring.Partitions = 8
	cfg.Handler = coordinator.HandlerFuncs{}
	c, err := coordinator.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		log.Fatal(err)
	}
	svc, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: c})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	svc.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	// The client, in any language: dial a node, ask.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	res, err := ownershippb.NewOwnershipClient(conn).Lookup(ctx, &ownershippb.LookupRequest{Key: []byte("user/42")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("owner %s at the address it gossips: %v, epoch %d\n", res.Owner, res.Address == lis.Addr().String(), res.Epoch)
	// Output: owner node-1 at the address it gossips: true, epoch 1
}
