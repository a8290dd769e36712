package routing_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/routing"
)

// kvServer is the owner's side of a KV service: it writes each key under
// the lease the guard put in the call's context.
type kvServer struct {
	kvpb.UnimplementedKVServer
	fence *ownership.MemoryFence
	mu    sync.Mutex
	data  map[string][]byte
}

func (s *kvServer) Put(ctx context.Context, req *kvpb.PutRequest) (*kvpb.PutResponse, error) {
	lease, ok := routing.LeaseFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no lease: the server has no guard")
	}
	err := s.fence.Do(ctx, lease.Token(), ownership.Exact, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.data[req.Key] = req.Value
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &kvpb.PutResponse{Partition: lease.Partition(), Epoch: lease.Token().Epoch}, nil
}

// A Put routed by its key: the owner serves the KV service behind the
// guard, and a caller's router sends the call to the key's owner with a
// request id, so retries apply it once. Here one node is both.
func ExampleNewRouter_put() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fence, err := ownership.NewMemoryFence(8)
	if err != nil {
		log.Fatal(err)
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = "node-1"
	cfg.ServiceAddr = lis.Addr().String()
	cfg.Ring.Partitions = 8
	cfg.Fence = fence
	cfg.Handler = coordinator.HandlerFuncs{}
	c, err := coordinator.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitConverged(ctx); err != nil {
		log.Fatal(err)
	}
	yourServer := &kvServer{fence: fence, data: map[string][]byte{}}
	key, v := []byte("user:42"), []byte("hi")

	// On the owner:
	guard, _ := routing.NewGuard(routing.GuardConfig{Leases: c, Stale: c})
	srv := grpc.NewServer(guard.ServerOptions()...)
	kvpb.RegisterKVServer(srv, yourServer)
	// in a handler: lease, _ := routing.LeaseFrom(ctx); enter the partition's
	// gate (ownership/gate); fence the write with lease.Token(), and record
	// its request id in the same transaction (sqlfence.Requests)
	go srv.Serve(lis)
	defer srv.Stop()

	// On a caller:
	router, _ := routing.NewRouter(routing.RouterConfig{
		Owners:      c, // the local coordinator answers who owns a key
		Membership:  c, // and its events: calls in flight to an owner that left or lost the partition are cancelled
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
	})
	defer router.Close()
	client := kvpb.NewKVClient(router)                              // any generated client: the router is a grpc.ClientConnInterface
	ctx, _ = transport.WithRequestID(ctx, transport.NewRequestID()) // the write is applied once, however often it is retried
	resp, err := client.Put(transport.WithKey(ctx, key), &kvpb.PutRequest{Key: string(key), Value: v})

	fmt.Println("put:", err, "partition", resp.GetPartition())
	// Output: put: <nil> partition 2
}
