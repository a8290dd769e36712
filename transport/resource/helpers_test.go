package resource

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The test service, hand-described: tenure.resource.test.Store with Put
// (unary, BytesValue -> StringValue) and Repeat (server stream).
const (
	methodPut    = "/tenure.resource.test.Store/Put"
	methodRepeat = "/tenure.resource.test.Store/Repeat"
)

var repeatDesc = &grpc.StreamDesc{StreamName: "Repeat", ServerStreams: true}

// handler serves both methods of the test service.
type handler func(ctx context.Context) (string, error)

func storeDesc(h handler) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "tenure.resource.test.Store",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Put",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.BytesValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				run := func(ctx context.Context, _ any) (any, error) {
					out, err := h(ctx)
					return wrapperspb.String(out), err
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: methodPut}, run)
			},
		}},
		Streams: []grpc.StreamDesc{{StreamName: "Repeat", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			out, err := h(ss.Context())
			if err != nil {
				return err
			}
			return ss.SendMsg(wrapperspb.String(out))
		}}},
	}
}

// bufNet is a set of in-memory gRPC servers by address.
type bufNet struct {
	t   *testing.T
	mu  sync.Mutex
	lis map[string]*bufconn.Listener
}

func newBufNet(t *testing.T) *bufNet { return &bufNet{t: t, lis: map[string]*bufconn.Listener{}} }

// serve starts a server at addr serving h behind a TokenGuard for cfg.
func (n *bufNet) serve(addr string, cfg TokenGuardConfig, h handler) {
	g, err := NewTokenGuard(cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer(g.ServerOptions()...)
	s.RegisterService(storeDesc(h), struct{}{})
	n.mu.Lock()
	n.lis[addr] = lis
	n.mu.Unlock()
	go func() { _ = s.Serve(lis) }()
	n.t.Cleanup(s.Stop)
}

// conn dials addr with the token client interceptors.
func (n *bufNet) conn(addr string) *grpc.ClientConn {
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		n.mu.Lock()
		lis := n.lis[addr]
		n.mu.Unlock()
		if lis == nil {
			return nil, errors.New("bufnet: nothing listens at " + addr)
		}
		return lis.DialContext(ctx)
	})
	cc, err := grpc.NewClient("passthrough:///"+addr, dialer, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(transport.TokenUnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(transport.TokenStreamClientInterceptor()))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func put(ctx context.Context, cc grpc.ClientConnInterface) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, methodPut, wrapperspb.Bytes(nil), out)
	return out.GetValue(), err
}

// admitted answers with the token the guard admitted, in text form.
func admitted(ctx context.Context) (string, error) {
	t, ok := TokenFrom(ctx)
	if !ok {
		return "", errors.New("no token in the handler's context")
	}
	b, err := t.MarshalText()
	return string(b), err
}

func tokenString(t testing.TB, tok ownership.Token) string {
	t.Helper()
	b, err := tok.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
