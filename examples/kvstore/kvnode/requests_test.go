package kvnode_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/transport"
)

// A Put with a request id is applied once: a retry of it, through any
// node, is answered with the first response, even with another value, and
// the write log holds one record; without an id, each Put is a write. The
// duplicate count sees a write applied twice (the negative control).
func TestRequestIDAppliesOnce(t *testing.T) {
	db := sqliteDatabase(t)
	nodes := startCluster(t, testConfig("n0", db), testConfig("n1", db))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	idctx := metadata.AppendToOutgoingContext(ctx, transport.RequestIDMetadata, "req-1")
	first, err := client(t, nodes[0].GRPCAddr()).Put(idctx, &kvpb.PutRequest{Key: "k", Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	again, err := client(t, nodes[1].GRPCAddr()).Put(idctx, &kvpb.PutRequest{Key: "k", Value: []byte("2")})
	if err != nil || again.GetEpoch() != first.GetEpoch() || again.GetOwner() != first.GetOwner() {
		t.Fatalf("retry = %v, %v; want the first response %v", again, err, first)
	}
	got, err := client(t, nodes[1].GRPCAddr()).Get(ctx, &kvpb.GetRequest{Key: "k"})
	if err != nil || string(got.GetValue()) != "1" {
		t.Fatalf("get = %q, %v; want the first write's value", got.GetValue(), err)
	}
	var dups uint64
	for _, n := range nodes {
		dups += n.Stats().Duplicates
	}
	if dups != 1 {
		t.Errorf("%d duplicates counted, want 1", dups)
	}
	sqldb := db.open(t)
	if rows, d, err := kvnode.CountDuplicates(ctx, sqldb, ""); err != nil || rows != 1 || d != 0 {
		t.Errorf("CountDuplicates = %d rows, %d, %v; want 1, 0", rows, d, err)
	}
	// Without an id, the same write twice is two writes: the count sees it.
	for range 2 {
		if _, err := client(t, nodes[0].GRPCAddr()).Put(ctx, &kvpb.PutRequest{Key: "j", Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if rows, d, err := kvnode.CountDuplicates(ctx, sqldb, ""); err != nil || rows != 3 || d != 1 {
		t.Errorf("CountDuplicates = %d rows, %d, %v; want 3, 1", rows, d, err)
	}
	// A malformed id is refused.
	bad := metadata.AppendToOutgoingContext(ctx, transport.RequestIDMetadata, "has space")
	if _, err := client(t, nodes[0].GRPCAddr()).Put(bad, &kvpb.PutRequest{Key: "k", Value: []byte("3")}); err == nil {
		t.Error("a malformed request id was accepted")
	}
}
