package kvpb_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
)

// A client dials any kvstore node and calls Put; the node forwards the
// write to the key's owner, which commits it under its fencing token.
// (Compiled only: it needs a running node.)
func Example() {
	conn, err := grpc.NewClient("127.0.0.1:7947", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	kv := kvpb.NewKVClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	put, err := kv.Put(ctx, &kvpb.PutRequest{Key: "user/42", Value: []byte("alice")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("committed by %s in partition %d, epoch %d\n", put.Owner, put.Partition, put.Epoch)

	got, err := kv.Get(ctx, &kvpb.GetRequest{Key: "user/42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("user/42 = %s\n", got.Value)
}
