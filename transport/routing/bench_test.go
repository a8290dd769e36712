package routing

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/transport"
)

// benchPayload is the request of every benchmarked call.
var benchPayload = wrapperspb.Bytes(make([]byte, 256))

// benchNode starts a single node owning every partition, serving kv on
// loopback TCP behind an OwnerGuard when guarded.
func benchNode(b *testing.B, guarded bool) (addr string, r *Router) {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	c := singleNode(b, lis.Addr().String(), nil)
	var opts []grpc.ServerOption
	if guarded {
		g, err := NewGuard(GuardConfig{Leases: c, Stale: c})
		if err != nil {
			b.Fatal(err)
		}
		opts = g.ServerOptions()
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&kvDesc, &kv{name: "solo", open: !guarded})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	r, err = NewRouter(RouterConfig{Owners: c, Membership: c, DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close() })
	return lis.Addr().String(), r
}

func benchDirectConn(b *testing.B, addr string) *grpc.ClientConn {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	return cc
}

var benchKey = []byte("user-42")

// benchCalls makes call once, then b.N times under the timer.
func benchCalls(b *testing.B, call func() error) {
	b.Helper()
	if err := call(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoutedCall: a unary call through the Router (owner lookup,
// connection choice, key in metadata) to the guarded server.
func BenchmarkRoutedCall(b *testing.B) {
	_, r := benchNode(b, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := new(wrapperspb.StringValue)
	benchCalls(b, func() error {
		return r.Invoke(transport.WithKey(ctx, benchKey), methodPut, benchPayload, out)
	})
}

// BenchmarkDirectCall: the same call on a plain connection straight to the
// same guarded server, the key set in metadata by hand.
func BenchmarkDirectCall(b *testing.B) {
	addr, _ := benchNode(b, true)
	cc := benchDirectConn(b, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := new(wrapperspb.StringValue)
	benchCalls(b, func() error {
		return cc.Invoke(metadata.AppendToOutgoingContext(ctx, transport.KeyMetadata, string(benchKey)), methodPut, benchPayload, out)
	})
}

// BenchmarkDirectCallUnguarded: the same call to a server without the
// guard: what the server-side ownership check costs on top of
// BenchmarkDirectCall.
func BenchmarkDirectCallUnguarded(b *testing.B) {
	addr, _ := benchNode(b, false)
	cc := benchDirectConn(b, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := new(wrapperspb.StringValue)
	benchCalls(b, func() error { return cc.Invoke(ctx, methodPut, benchPayload, out) })
}
