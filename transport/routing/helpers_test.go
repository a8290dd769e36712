package routing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
)

func TestMain(m *testing.M) {
	tenuretest.VerifyTestMain(m)
}

// testPartitions keeps clusters quick to converge.
const testPartitions = 16

// The test service, hand-described so the tests need no generated code:
// tenure.transport.test.KV with
//   - Put (unary): BytesValue -> StringValue (the serving node's name)
//   - Count (client stream): BytesValue... -> StringValue ("node:n")
//   - Repeat (server stream): BytesValue -> StringValue x3 (node names)
const (
	methodPut    = "/tenure.transport.test.KV/Put"
	methodCount  = "/tenure.transport.test.KV/Count"
	methodRepeat = "/tenure.transport.test.KV/Repeat"
)

type kvServer interface {
	put(ctx context.Context, v *wrapperspb.BytesValue) (*wrapperspb.StringValue, error)
	node() string
}

var kvDesc = grpc.ServiceDesc{
	ServiceName: "tenure.transport.test.KV",
	HandlerType: (*kvServer)(nil),
	Methods: []grpc.MethodDesc{putMethod(func(srv any, ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
		return srv.(kvServer).put(ctx, in)
	})},
	Streams: []grpc.StreamDesc{
		{StreamName: "Count", ClientStreams: true, Handler: countHandler},
		{StreamName: "Repeat", ServerStreams: true, Handler: repeatHandler},
	},
}

// putMethod describes the test service's Put, served by h behind the
// server's interceptors.
func putMethod(h func(srv any, ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.StringValue, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: "Put",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			handler := func(ctx context.Context, req any) (any, error) {
				return h(srv, ctx, req.(*wrapperspb.BytesValue))
			}
			if icpt == nil {
				return handler(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodPut}, handler)
		},
	}
}

var (
	countDesc  = &grpc.StreamDesc{StreamName: "Count", ClientStreams: true}
	repeatDesc = &grpc.StreamDesc{StreamName: "Repeat", ServerStreams: true}
)

func countHandler(srv any, ss grpc.ServerStream) error {
	if _, ok := LeaseFrom(ss.Context()); !ok {
		return status.Error(codes.Internal, "no lease in the stream's context")
	}
	n := 0
	for {
		var m wrapperspb.BytesValue
		err := ss.RecvMsg(&m)
		if err == io.EOF {
			return ss.SendMsg(wrapperspb.String(fmt.Sprintf("%s:%d", srv.(kvServer).node(), n)))
		}
		if err != nil {
			return err
		}
		n++
	}
}

func repeatHandler(srv any, ss grpc.ServerStream) error {
	if _, ok := LeaseFrom(ss.Context()); !ok {
		return status.Error(codes.Internal, "no lease in the stream's context")
	}
	var m wrapperspb.BytesValue
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	for range 3 {
		if err := ss.SendMsg(wrapperspb.String(srv.(kvServer).node())); err != nil {
			return err
		}
	}
	return nil
}

// writeLog records the writes a fenced resource accepted, per partition.
type writeLog struct {
	mu       sync.Mutex
	accepted map[uint32][]ownership.Token
	stale    int // writes that ran under a token that was not the mark
	total    int
	// ids are the request ids applied, per partition: a write whose id is
	// here is answered as applied and not applied again (the resource
	// deduplicates, inside the fenced write, as sqlfence.Requests does).
	ids   map[uint32]map[string]bool
	dupes int // writes whose id was applied already
}

func newWriteLog() *writeLog {
	return &writeLog{accepted: map[uint32][]ownership.Token{}, ids: map[uint32]map[string]bool{}}
}

// kv is the resource's server: every Put is a write fenced in Exact mode
// under the lease the guard gave the call.
type kv struct {
	name  string
	fence *ownership.MemoryFence // nil: no write, only answer
	log   *writeLog
	calls atomic.Int64
	open  bool // served without a guard: no lease expected
}

func (s *kv) node() string { return s.name }

func (s *kv) put(ctx context.Context, _ *wrapperspb.BytesValue) (*wrapperspb.StringValue, error) {
	s.calls.Add(1)
	if s.open {
		return wrapperspb.String(s.name), nil
	}
	l, ok := LeaseFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no lease in the handler's context")
	}
	if s.fence != nil {
		t := l.Token()
		id, err := transport.RequestIDFromIncoming(ctx)
		if err != nil {
			return nil, err
		}
		err = s.fence.Do(ctx, t, ownership.Exact, func() error {
			s.log.mu.Lock()
			defer s.log.mu.Unlock()
			if id != "" {
				if s.log.ids[t.Partition][id] {
					s.log.dupes++
					return nil // answered with the first outcome
				}
				if s.log.ids[t.Partition] == nil {
					s.log.ids[t.Partition] = map[string]bool{}
				}
				s.log.ids[t.Partition][id] = true
			}
			if cur := s.fence.Current(t.Partition); !cur.Same(t) {
				s.log.stale++
			}
			s.log.accepted[t.Partition] = append(s.log.accepted[t.Partition], t)
			s.log.total++
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return wrapperspb.String(s.name), nil
}

// checkLog asserts S1 on the log: every accepted write ran under the mark,
// and per partition the accepted tokens never go down.
func checkLog(t *testing.T, log *writeLog) {
	t.Helper()
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.stale != 0 {
		t.Errorf("%d writes ran under a token that was not the resource's mark", log.stale)
	}
	for p, ts := range log.accepted {
		for i := 1; i < len(ts); i++ {
			if ts[i].Less(ts[i-1]) {
				t.Errorf("partition %d: write under %v accepted after %v", p, ts[i], ts[i-1])
			}
		}
	}
}

func put(ctx context.Context, cc grpc.ClientConnInterface, key string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(transport.WithKey(ctx, []byte(key)), methodPut, wrapperspb.Bytes([]byte(key)), out)
	return out.GetValue(), err
}

// --- fakes ---

// fakeLeases answers Lease with a function; Self is "self".
type fakeLeases struct {
	lease    func(key []byte) (*ownership.Lease, error)
	reported atomic.Int64
}

func (f *fakeLeases) Lease(key []byte) (*ownership.Lease, error) { return f.lease(key) }
func (f *fakeLeases) Self() ownership.Node                       { return ownership.Node{Name: "self", Incarnation: 7} }
func (f *fakeLeases) ReportStale(error) bool                     { f.reported.Add(1); return true }

func notOwner(node, addr string, epoch uint64) error {
	o := ownership.OwnerInfo{Partition: 3, Node: node, Addr: addr}
	if epoch > 0 {
		o.Token = ownership.Token{Partition: 3, Epoch: epoch, Owner: node, Incarnation: 1}
	}
	return &ownership.NotOwnerError{Owner: o}
}

// fakeOwners names one address for every key, and is the router's
// Membership: its members are what members holds (nil: none known), and
// leave sends an event.
type fakeOwners struct {
	mu      sync.Mutex
	addr    string
	node    string // the owner's name; default "n-" + addr
	token   ownership.Token
	err     error
	members []ownership.Member
	events  chan coordinator.Event
	// room, if set, is the subscription's room for events instead of what
	// the router asks; noEvents makes Subscribe return no channel.
	room     int
	noEvents bool
	// owners counts the calls of Owner.
	owners atomic.Int64
}

func (f *fakeOwners) Owner([]byte) (ownership.OwnerInfo, error) {
	f.owners.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return ownership.OwnerInfo{}, f.err
	}
	node := f.node
	if node == "" {
		node = "n-" + f.addr
	}
	return ownership.OwnerInfo{Partition: 3, Node: node, Addr: f.addr, Token: f.token}, nil
}

func (f *fakeOwners) set(addr string) {
	f.mu.Lock()
	f.addr = addr
	f.mu.Unlock()
}

// claim makes node at addr the owner, holding a claim (heard by gossip).
func (f *fakeOwners) claim(node, addr string) {
	f.mu.Lock()
	f.node, f.addr = node, addr
	f.token = ownership.Token{Partition: 3, Epoch: 9, Owner: node, Incarnation: 1}
	t := f.token
	f.mu.Unlock()
	f.event(coordinator.Event{Kind: coordinator.EventHolderChanged, Partition: 3, Node: node, Token: t})
}

// ownedBy returns a fakeOwners that names addr for every key, with
// members serving at addr and at others (hints are followed only to them).
func ownedBy(addr string, others ...string) *fakeOwners {
	f := &fakeOwners{addr: addr}
	f.setMembers(append([]string{addr}, others...)...)
	return f
}

func (f *fakeOwners) Members() []ownership.Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ownership.Member(nil), f.members...)
}

// setMembers replaces the members (name = address) and sends an event.
func (f *fakeOwners) setMembers(addrs ...string) {
	f.mu.Lock()
	f.members = nil
	for _, a := range addrs {
		f.members = append(f.members, ownership.Member{Name: "n-" + a, ServiceAddr: a})
	}
	f.mu.Unlock()
	f.event(coordinator.Event{Kind: coordinator.EventMemberLeft})
}

func (f *fakeOwners) event(e coordinator.Event) {
	f.mu.Lock()
	ch := f.events
	f.mu.Unlock()
	if ch != nil {
		select {
		case ch <- e:
		default:
		}
	}
}

func (f *fakeOwners) Subscribe(buf int) (<-chan coordinator.Event, func()) {
	if f.noEvents {
		return nil, func() {}
	}
	if f.room > 0 {
		buf = f.room
	}
	ch := make(chan coordinator.Event, buf)
	f.mu.Lock()
	f.events = ch
	f.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			f.mu.Lock()
			f.events = nil
			f.mu.Unlock()
		})
	}
}

// ownersAndMembers is what a test router follows.
type ownersAndMembers interface {
	Owners
	Membership
}

// bufNet is a set of in-memory gRPC servers by address.
type bufNet struct {
	t    *testing.T
	mu   sync.Mutex
	lis  map[string]*bufconn.Listener
	srvs map[string]*grpc.Server
}

func newBufNet(t *testing.T) *bufNet {
	n := &bufNet{t: t, lis: map[string]*bufconn.Listener{}, srvs: map[string]*grpc.Server{}}
	t.Cleanup(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, s := range n.srvs {
			s.Stop()
		}
	})
	return n
}

// serve starts a server at addr with opts; register registers services.
func (n *bufNet) serve(addr string, register func(*grpc.Server), opts ...grpc.ServerOption) {
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer(opts...)
	register(s)
	n.mu.Lock()
	n.lis[addr], n.srvs[addr] = lis, s
	n.mu.Unlock()
	go func() { _ = s.Serve(lis) }()
}

func (n *bufNet) dialer() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		n.mu.Lock()
		lis := n.lis[addr]
		n.mu.Unlock()
		if lis == nil {
			return nil, errors.New("bufnet: nothing listens at " + addr)
		}
		return lis.DialContext(ctx)
	})
}

func (n *bufNet) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{n.dialer(), grpc.WithTransportCredentials(insecure.NewCredentials())}
}

func (n *bufNet) router(owners ownersAndMembers, tweak func(*RouterConfig)) *Router {
	cfg := RouterConfig{Owners: owners, Membership: owners, DialOptions: n.dialOptions(), BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := NewRouter(cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = r.Close() })
	return r
}

// guarded registers a kv named name behind a guard on leases at addr.
func (n *bufNet) guarded(addr string, leases nodeLeases) *kv {
	g, err := NewGuard(GuardConfig{Leases: leases, Stale: leases})
	if err != nil {
		n.t.Fatal(err)
	}
	s := &kv{name: addr}
	n.serve(addr, func(gs *grpc.Server) { gs.RegisterService(&kvDesc, s) }, g.ServerOptions()...)
	return s
}

// liveLease returns a lease that never ends during the test.
func liveLease(t *testing.T) *ownership.Lease {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ownership.NewLease(ctx, ownership.Token{Partition: 3, Epoch: 2, Owner: "self", Incarnation: 7})
}

// --- real coordinators ---

func coordConfig(name string) coordinator.Config {
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring = ring.Config{Partitions: testPartitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	cfg.Rand = rand.New(rand.NewPCG(uint64(len(name)), uint64(time.Now().UnixNano())))
	cfg.Handler = coordinator.HandlerFuncs{}
	return cfg
}

// singleNode starts a one-node cluster that owns every partition.
func singleNode(t testing.TB, serviceAddr string, fence ownership.Fence) *coordinator.Coordinator {
	t.Helper()
	cfg := coordConfig("solo")
	cfg.ServiceAddr = serviceAddr
	cfg.Fence = fence
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := testkit.Ctx(t, 20*time.Second)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeLeases is what a test guard asks of its node.
type nodeLeases interface {
	Leases
	StaleReporter
}

// withRawRequestID adds a request id to ctx's outgoing metadata without
// WithRequestID's checks, as a careless client might.
func withRawRequestID(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, transport.RequestIDMetadata, id)
}
