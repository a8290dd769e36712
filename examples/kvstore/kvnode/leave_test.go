package kvnode_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checking
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/transport"
)

// balancedClient dials every node through one connection that balances
// calls round robin over the nodes whose health service says SERVING, as a
// production client of the cluster would.
func balancedClient(t *testing.T, nodes []*kvnode.Node) kvpb.KVClient {
	t.Helper()
	r := manual.NewBuilderWithScheme("kvtest")
	var addrs []resolver.Address
	for _, n := range nodes {
		addrs = append(addrs, resolver.Address{Addr: n.GRPCAddr()})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	cc, err := grpc.NewClient(r.Scheme()+":///kv", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}],
			"healthCheckConfig": {"serviceName": "`+kvpb.KV_ServiceDesc.ServiceName+`"}}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return kvpb.NewKVClient(cc)
}

// A graceful leave under load fails no call: the leaving node answers
// NOT_SERVING at once, so balanced clients move away, and serves the calls
// that still reach it (forwarding them) until they stop coming, while its
// partitions are handed off. No write is applied twice.
func TestGracefulLeaveFailsNoCall(t *testing.T) {
	db := sqliteDatabase(t)
	nodes := startCluster(t, testConfig("n0", db), testConfig("n1", db), testConfig("n2", db))
	kv := balancedClient(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				cctx, _ = transport.WithRequestID(cctx, transport.NewRequestID())
				_, err := kv.Put(cctx, &kvpb.PutRequest{Key: fmt.Sprintf("w%d/k%d", w, i%20), Value: []byte(fmt.Sprint(i))})
				ccancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	before, cancelBefore := context.WithTimeout(ctx, 20*time.Second)
	defer cancelBefore()
	tenuretest.WaitFor(before, t, "load before the leave", func() bool { return calls.Load() >= 50 })
	if err := nodes[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	base := calls.Load()
	after, cancelAfter := context.WithTimeout(ctx, 20*time.Second)
	defer cancelAfter()
	tenuretest.WaitFor(after, t, "load after the leave", func() bool { return calls.Load() >= base+50 })
	close(stop)
	wg.Wait()
	if failed.Load() != 0 {
		t.Errorf("%d of %d calls failed during a graceful leave; first: %v", failed.Load(), calls.Load(), firstErr.Load())
	}
	if rows, dups, err := kvnode.CountDuplicates(ctx, db.open(t), ""); err != nil || dups != 0 || rows == 0 {
		t.Errorf("CountDuplicates = %d rows, %d duplicates, %v; want 0 duplicates", rows, dups, err)
	}
}
