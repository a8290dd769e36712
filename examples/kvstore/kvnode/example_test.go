package kvnode_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
)

// Start a node, then write and read a key through its gRPC service as any
// client would. More nodes join with Config.Seeds set to this one's
// GossipAddr and the same DataPath (or DSN).
func Example() {
	dir, err := os.MkdirTemp("", "kvnode-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	node, err := kvnode.Start(ctx, kvnode.Config{
		Name:        "n1",
		GossipAddr:  "127.0.0.1:0",
		GRPCAddr:    "127.0.0.1:0",
		DataPath:    filepath.Join(dir, "kv.db"),
		Coordinator: smallConfig(),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer node.Leave(ctx)
	// Start returns once the node serves; it claims its partitions in the
	// background (each fenced in the database), and calls wait for that.
	if err := node.Coordinator().WaitConverged(ctx); err != nil {
		log.Fatal(err)
	}

	conn, err := grpc.NewClient("passthrough:///"+node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	kv := kvpb.NewKVClient(conn)
	put, err := kv.Put(ctx, &kvpb.PutRequest{Key: "greeting", Value: []byte("hello")})
	if err != nil {
		log.Fatal(err)
	}
	get, err := kv.Get(ctx, &kvpb.GetRequest{Key: "greeting"})
	if err != nil {
		log.Fatal(err)
	}
	// put.GetEpoch() is the epoch of n1's lease the write committed under.
	fmt.Printf("written by %s; read %q\n", put.GetOwner(), get.GetValue())
	// Output: written by n1; read "hello"
}

// smallConfig is the local preset with a small ring, so the example
// converges fast however loaded the machine is.
func smallConfig() coordinator.Config {
	cfg := coordinator.LocalConfig()
	cfg.Ring.Partitions = 16
	return cfg
}
