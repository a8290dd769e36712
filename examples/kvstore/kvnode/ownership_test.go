package kvnode_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ring"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// A node serves the Ownership service and server reflection on its gRPC
// port: a client that knows nothing but the address asks who owns a key
// and gets the answer the node's coordinator gives, and a reflection
// client lists the KV and Ownership services.
func TestServesOwnershipAndReflection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	dir := t.TempDir()
	cfg := func(name string) kvnode.Config {
		cc := coordinator.LocalConfig()
		cc.Ring = ring.Config{Partitions: 16, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
		return kvnode.Config{Name: name, GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
			DataPath: filepath.Join(dir, "kv.db"), Coordinator: cc}
	}
	n0, err := kvnode.Start(ctx, cfg("n0"))
	if err != nil {
		t.Fatal(err)
	}
	defer n0.Close()
	c1 := cfg("n1")
	c1.Seeds = []string{n0.GossipAddr()}
	n1, err := kvnode.Start(ctx, c1)
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	for _, n := range []*kvnode.Node{n0, n1} {
		for len(n.Coordinator().Members()) != 2 {
			select {
			case <-ctx.Done():
				t.Fatalf("%s does not see 2 members: %v", n.Coordinator().Self().Name, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err := n.Coordinator().WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
	}

	cc, err := grpc.NewClient("passthrough:///"+n1.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	own := pb.NewOwnershipClient(cc)
	for _, key := range []string{"a", "user:42", "zzz"} {
		want, err := n1.Coordinator().Owner([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		got, err := own.Lookup(ctx, &pb.LookupRequest{Key: []byte(key)})
		if err != nil {
			t.Fatalf("Lookup(%q): %v", key, err)
		}
		if got.GetOwner() != want.Node || got.GetAddress() != want.Addr || got.GetPartition() != want.Partition {
			t.Errorf("Lookup(%q) = %v; the coordinator says %s at %s, partition %d", key, got, want.Node, want.Addr, want.Partition)
		}
		if a := map[string]string{"n0": n0.GRPCAddr(), "n1": n1.GRPCAddr()}[got.GetOwner()]; a != got.GetAddress() {
			t.Errorf("Lookup(%q): owner %q at %q, but that node serves at %q", key, got.GetOwner(), got.GetAddress(), a)
		}
	}
	st, err := own.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetNode() != "n1" || st.GetPartitionCount() != 16 || len(st.GetMembers()) != 2 {
		t.Errorf("Status = %v, want node n1, 16 partitions, 2 members", st)
	}

	stream, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{kvpb.KV_ServiceDesc.ServiceName, pb.Ownership_ServiceDesc.ServiceName, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection lists %v, without %s", services, want)
		}
	}
}
