package kvpb_test

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
	"github.com/tenure-go/tenure/transport"
)

// A client dials any kvstore node and calls Put; the node forwards the
// write to the key's owner, which commits it under its fencing token. The
// request id makes a retry of the same write (after an unknown outcome)
// safe: it is answered with the first response. Here the cluster is one
// node.
func Example() {
	dir, err := os.MkdirTemp("", "kvpb-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc := coordinator.LocalConfig()
	cc.Ring.Partitions = 16
	node, err := kvnode.Start(ctx, kvnode.Config{Name: "n1", GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		DataPath: filepath.Join(dir, "kv.db"), Coordinator: cc})
	if err != nil {
		log.Fatal(err)
	}
	defer node.Close()
	if err := node.Coordinator().WaitConverged(ctx); err != nil {
		log.Fatal(err)
	}

	conn, err := grpc.NewClient(node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	kv := kvpb.NewKVClient(conn)
	wctx, err := transport.WithRequestID(ctx, transport.NewRequestID())
	if err != nil {
		log.Fatal(err)
	}
	put, err := kv.Put(wctx, &kvpb.PutRequest{Key: "user/42", Value: []byte("alice")})
	if err != nil {
		log.Fatal(err) // with transport.IsOutcomeUnknown(err), retry with wctx
	}
	again, err := kv.Put(wctx, &kvpb.PutRequest{Key: "user/42", Value: []byte("alice")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("committed by %s, epoch %d; the retry answered alike: %v\n", put.Owner, put.Epoch, again.Epoch == put.Epoch)

	got, err := kv.Get(ctx, &kvpb.GetRequest{Key: "user/42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("user/42 = %s\n", got.Value)
	// Output:
	// committed by n1, epoch 1; the retry answered alike: true
	// user/42 = alice
}
