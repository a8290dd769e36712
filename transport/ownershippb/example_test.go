package ownershippb_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/transport/ownershippb"
)

// A client asks a node which node owns a key, and where to reach it. The
// answer is the node's view: the owner may change right after, and the
// resource's fence is what rejects a write under an old token.
// (Compiled only: it needs a node serving transport.NewOwnershipService.)
func Example() {
	conn, err := grpc.NewClient("127.0.0.1:7947", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := ownershippb.NewOwnershipClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := client.Lookup(ctx, &ownershippb.LookupRequest{Key: []byte("user/42")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("partition %d: owner %s at %s, epoch %d\n", res.Partition, res.Owner, res.Address, res.Epoch)
}
