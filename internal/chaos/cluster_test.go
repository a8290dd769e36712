package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/faultnet"
	"github.com/tenure-go/tenure/transport/routing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The register service every node serves, hand-written (no protoc): one
// unary method whose request and reply are JSON in a BytesValue.
const methodDo = "/tenure.chaos.Register/Do"

type request struct {
	Write  bool   `json:"w"`
	Value  string `json:"v"`
	Client int    `json:"c"`
}

type reply struct {
	Token    ownership.Token `json:"t"` // the token the node served the call with
	OutToken ownership.Token `json:"ot"`
	Value    string          `json:"v"`
}

type registerServer interface {
	do(ctx context.Context, req request) (reply, error)
}

var registerDesc = grpc.ServiceDesc{
	ServiceName: "tenure.chaos.Register",
	HandlerType: (*registerServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Do",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				var r request
				if err := json.Unmarshal(req.(*wrapperspb.BytesValue).Value, &r); err != nil {
					return nil, status.Error(codes.InvalidArgument, err.Error())
				}
				out, err := srv.(registerServer).do(ctx, r)
				if err != nil {
					return nil, err
				}
				b, err := json.Marshal(out)
				if err != nil {
					return nil, status.Error(codes.Internal, err.Error())
				}
				return wrapperspb.Bytes(b), nil
			}
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodDo}, h)
		},
	}},
}

// runConfig is one configuration of the suite.
type runConfig struct {
	name       string
	nodes      int
	partitions int
	clients    int
	events     int
	fencing    bool   // false: the negative control
	sql        bool   // SQLite resource and SQL authority (S4)
	postgres   bool   // with sql: PostgreSQL, its fence Concurrent, instead of SQLite
	seed       uint64 // the schedule's seed
	// script, when set, replaces the random schedule: episodes in the
	// simulator's vocabulary (see script_test.go).
	script string
}

// gate is the in-process pause gate: a call that reaches it after its
// token was attached, and before its write is sent, waits there while the
// gate holds it (a process paused past its lease).
type gate struct {
	mu      sync.Mutex
	budget  map[holdKey]int // calls still to hold
	last    ownership.Token // the token of the last call held
	release chan struct{}
	waiting atomic.Int64
	stop    <-chan struct{}
}

// holdKey says which calls a hold applies to: a partition (-1: any) and
// whether reads pass.
type holdKey struct {
	p          int64
	writesOnly bool
}

func newGate(stop <-chan struct{}) *gate {
	return &gate{budget: map[holdKey]int{}, release: make(chan struct{}), stop: stop}
}

// hold makes the next n calls on partition p (-1: any partition) wait;
// with writesOnly, reads pass.
func (g *gate) hold(p int64, n int, writesOnly bool) {
	g.mu.Lock()
	g.budget[holdKey{p, writesOnly}] += n
	g.mu.Unlock()
}

// open lets every waiting call go and holds no more.
func (g *gate) open() {
	g.mu.Lock()
	close(g.release)
	g.release = make(chan struct{})
	clear(g.budget)
	g.mu.Unlock()
}

// lastHeld returns the token of the last call held.
func (g *gate) lastHeld() ownership.Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// pass waits while the gate holds the call under t, and reports whether
// it did.
func (g *gate) pass(t ownership.Token, write bool) bool {
	p := int64(t.Partition)
	g.mu.Lock()
	var ch chan struct{}
	for _, k := range []holdKey{{p, false}, {-1, false}, {p, true}, {-1, true}} {
		if g.budget[k] > 0 && (write || !k.writesOnly) {
			g.budget[k]--
			g.last = t
			ch = g.release
			break
		}
	}
	g.mu.Unlock()
	if ch == nil {
		return false
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	select {
	case <-ch:
	case <-g.stop:
	}
	return true
}

// node is one member: a coordinator, its clock, its gRPC server and its
// gate.
type node struct {
	cl        *cluster
	name      string
	addr      string
	gossip    int // the gossip port
	c         *coordinator.Coordinator
	clock     *SkewClock
	srv       *grpc.Server
	gate      *gate
	ambiguous atomic.Bool
	rng       *lockedRand
	stopped   atomic.Bool
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// cluster is one run: nodes, the fault network, the resource, the
// workload and the records the checks read.
type cluster struct {
	t    *testing.T
	cfg  runConfig
	net  *faultnet.Network
	hist *History
	res  resource
	auth *recAuthority // sql only
	stop chan struct{} // closed at the end: gates let everything go
	rng  *rand.Rand    // the schedule's; used by the test goroutine only

	mu       sync.Mutex
	nodes    map[string]*node
	keys     map[uint32]string // a key routed to each partition
	grants   map[ownership.Token]int
	leases   map[ownership.Token]*ownership.Lease
	byPart   map[uint32][]*ownership.Lease // the leases not yet seen ended
	endedAt  map[*ownership.Lease]int64    // when a lease was seen ended (Now)
	staleAt  map[ownership.Token]int64     // a token's first stale rejection
	okTokens map[ownership.Token]int
	held     []Record // the calls the pause gate held, once answered
	viol     []string
	ops      []clientOp

	stale atomic.Int64
}

// clientOp is one call as the client saw it.
type clientOp struct {
	client int
	key    string
	write  bool
	value  string
	start  int64
	end    int64
	err    error
	rep    reply
}

func newCluster(t *testing.T, cfg runConfig, res func(*cluster) resource) *cluster {
	cl := &cluster{
		t:        t,
		cfg:      cfg,
		net:      faultnet.New(faultnet.WithSeed(cfg.seed)),
		hist:     NewHistory(nil),
		stop:     make(chan struct{}),
		rng:      rand.New(rand.NewPCG(cfg.seed, 0x7e4e)),
		nodes:    map[string]*node{},
		grants:   map[ownership.Token]int{},
		leases:   map[ownership.Token]*ownership.Lease{},
		byPart:   map[uint32][]*ownership.Lease{},
		endedAt:  map[*ownership.Lease]int64{},
		staleAt:  map[ownership.Token]int64{},
		okTokens: map[ownership.Token]int{},
	}
	cl.res = res(cl)
	t.Cleanup(func() {
		cl.openStop()
		for _, n := range cl.all() {
			n.crash()
		}
	})
	return cl
}

func (cl *cluster) openStop() {
	select {
	case <-cl.stop:
	default:
		close(cl.stop)
	}
}

func (cl *cluster) violation(format string, args ...any) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.viol = append(cl.viol, fmt.Sprintf(format, args...))
}

// A partition's epoch changes only when its owner changes. The checks
// below flag a new token for a partition (minted by the authority, fenced
// at the resource, or granted) while the same node, by name, still holds
// a live lease on that partition under another token: the state machine
// revokes a lease before it claims again, so a node never needs a new
// epoch for a partition it holds.
//
// The other half of the rule, that a different node must not fence a
// healthy owner, is not checked here: a node claims when its own view of
// membership gives it the partition, and on a loaded machine memberlist
// may suspect a live node with no fault injected at all, so "the ring
// owner did not change and no fault cut it off" can't be observed without
// false positives. The duel check after each healed event (a bounded
// number of epochs per event) covers the behaviour that matters.

// onFence is the resource's hook: a fence under t raised the mark.
func (cl *cluster) onFence(t ownership.Token) { cl.checkNewEpoch("fenced", t) }

// onClaim is the recording authority's sink (the SQL run).
func (cl *cluster) onClaim(c claimRec) {
	if c.Err == "" {
		cl.checkNewEpoch("minted", c.Token)
	}
}

func (cl *cluster) checkNewEpoch(what string, t ownership.Token) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.checkNewEpochLocked(what, t)
}

func (cl *cluster) checkNewEpochLocked(what string, t ownership.Token) {
	ls := cl.byPart[t.Partition][:0]
	for _, l := range cl.byPart[t.Partition] {
		if l.Err() != nil {
			continue
		}
		ls = append(ls, l)
		if old := l.Token(); old.Owner == t.Owner && !old.Same(t) {
			cl.viol = append(cl.viol, fmt.Sprintf("epoch changed without an owner change: %v %s while %v was live", t, what, old))
		}
	}
	cl.byPart[t.Partition] = ls
}

func (cl *cluster) all() []*node {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := make([]*node, 0, len(cl.nodes))
	for _, n := range cl.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *node) int { return strings.Compare(a.name, b.name) })
	return out
}

// live returns the running nodes.
func (cl *cluster) live() []*node {
	var out []*node
	for _, n := range cl.all() {
		if !n.stopped.Load() {
			out = append(out, n)
		}
	}
	return out
}

func (cl *cluster) names() []string {
	var out []string
	for _, n := range cl.all() {
		out = append(out, n.name)
	}
	return out
}

// start starts (or restarts) the node called name with the service
// address addr and the gossip port gossip; "" and 0 pick new ones. An
// address still taken after a few seconds (by another process, since the
// last holder was shut down) is given up for a new one: see the result's
// addresses.
func (cl *cluster) start(ctx context.Context, name, addr string, gossip int) *node {
	t := cl.t
	t.Helper()
	lis := cl.listen(ctx, addr)
	var tr *faultnet.Transport
	bind := func(port int) bool {
		var err error
		tr, err = cl.net.Transport(name, faultnet.TransportConfig{BindPort: port})
		if err != nil && port == 0 {
			t.Fatal(err)
		}
		return err == nil
	}
	if gossip == 0 || !waitFor(ctx, 5*time.Second, func() bool { return bind(gossip) }) {
		bind(0)
	}
	n := &node{
		cl:     cl,
		name:   name,
		addr:   lis.Addr().String(),
		gossip: tr.Port(),
		clock:  NewSkewClock(),
		gate:   newGate(cl.stop),
		rng:    &lockedRand{r: rand.New(rand.NewPCG(cl.rng.Uint64(), 1))},
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring = ring.Config{Partitions: cl.cfg.partitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	cfg.Rand = rand.New(rand.NewPCG(cl.rng.Uint64(), uint64(time.Now().UnixNano())))
	cfg.Clock = n.clock
	cfg.ServiceAddr = n.addr
	cfg.Fence = cl.res
	if cl.auth != nil {
		cfg.Authority = cl.auth
	}
	cfg.Handler = coordinator.HandlerFuncs{AcquireFunc: cl.acquired}
	for _, o := range cl.live() {
		if o.name != name {
			cfg.Seeds = append(cfg.Seeds, o.c.GossipAddr())
		}
	}
	ml := *cfg.Memberlist
	ml.Transport = tr
	cfg.Memberlist = &ml
	c, err := coordinator.New(cfg)
	if err != nil {
		_ = lis.Close()
		_ = tr.Shutdown()
		t.Fatal(err)
	}
	n.c = c
	if err := c.Start(ctx); err != nil {
		_ = lis.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	g, err := routing.NewGuard(routing.GuardConfig{Leases: guardLeases{n}, Stale: guardLeases{n}})
	if err != nil {
		t.Fatal(err)
	}
	n.srv = grpc.NewServer(g.ServerOptions()...)
	n.srv.RegisterService(&registerDesc, n)
	go func() { _ = n.srv.Serve(lis) }()
	cl.mu.Lock()
	cl.nodes[name] = n
	cl.mu.Unlock()
	return n
}

// listen listens on addr ("": a new port), waiting a few seconds for a
// port just closed to be free again.
func (cl *cluster) listen(ctx context.Context, addr string) net.Listener {
	var lis net.Listener
	if addr != "" && waitFor(ctx, 5*time.Second, func() bool {
		var err error
		lis, err = net.Listen("tcp", addr)
		return err == nil
	}) {
		return lis
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cl.t.Fatal(err)
	}
	return lis
}

// acquired is every node's Handler.Acquire: it records the grant (S3) and
// the lease (to tell later whether it was still live, and when it ended).
func (cl *cluster) acquired(_ context.Context, l *ownership.Lease) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	t := l.Token()
	cl.checkNewEpochLocked("granted", t)
	t.MAC = [ownership.MACSize]byte{}
	cl.grants[t]++
	cl.leases[t] = l
	cl.byPart[t.Partition] = append(cl.byPart[t.Partition], l)
	context.AfterFunc(l.Context(), func() {
		cl.mu.Lock()
		cl.endedAt[l] = Now()
		cl.mu.Unlock()
	})
	return nil
}

// guardLeases is what a node's OwnerGuard asks for leases: the node's
// coordinator, with the serving check on every lease it hands out.
type guardLeases struct{ n *node }

func (g guardLeases) Lease(key []byte) (*ownership.Lease, error) {
	asked := Now()
	l, err := g.n.c.Lease(key)
	if err == nil {
		g.n.cl.checkServing(g.n.name, l, asked)
	}
	return l, err
}

func (g guardLeases) Self() ownership.Node { return g.n.c.Self() }

func (g guardLeases) ReportStale(err error) bool { return g.n.c.ReportStale(err) }

// checkServing flags a node that serves a call under a lease that had
// already ended (revoked, fenced out and reported stale, or stepped
// down) when the guard asked for it: a fenced node must stop serving.
// The end is recorded after it happens, so a lease ending while the
// guard asks is never flagged.
func (cl *cluster) checkServing(name string, l *ownership.Lease, asked int64) {
	cl.mu.Lock()
	at, ended := cl.endedAt[l]
	cl.mu.Unlock()
	if ended && at < asked {
		cl.violation("node %s served a call under %v %v after its lease ended", name, l.Token(), time.Duration(asked-at))
	}
}

// checkFencedEnded: every token the resource rejected as stale lost its
// lease by the end of the run (the guard reported it, the coordinator
// revoked it).
func (cl *cluster) checkFencedEnded() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []string
	for t := range cl.staleAt {
		if l := cl.leases[t]; l != nil && l.Err() == nil {
			out = append(out, fmt.Sprintf("fenced node still holds a live lease for %v, rejected as stale", t))
		}
	}
	return out
}

// crash stops the node without a goodbye. Calls held at its gate go on
// (a write already on the wire when the process died).
func (n *node) crash() {
	if n.stopped.Swap(true) {
		return
	}
	n.gate.open()
	n.srv.Stop()
	_ = n.c.Close()
}

// do is the register service's handler: it takes the lease's token, passes
// the pause gate, and calls the resource with its own deadline (the
// resource does not know the owner's lease).
func (n *node) do(ctx context.Context, req request) (reply, error) {
	cl := n.cl
	lease, ok := routing.LeaseFrom(ctx)
	if !ok {
		return reply{}, status.Error(codes.Internal, "no lease")
	}
	t := lease.Token()
	kind := Read
	if req.Write {
		kind = Write
	}
	held := n.gate.pass(t, req.Write)
	// The call starts when it is sent to the resource: after the gate, so a
	// held write can't be linearized before a fence it never overlapped.
	rec := Record{Client: req.Client + 1, Node: n.name, Kind: kind, Token: t, Value: req.Value, Start: Now()}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var out reply
	var err error
	out.Token = t
	if req.Write {
		err = cl.res.write(rctx, t, req.Value)
		out.Value = req.Value
	} else {
		out.OutToken, out.Value, err = cl.res.read(rctx, t)
	}
	rec.End, rec.Out = Now(), classify(err)
	rec.OutToken, rec.OutValue = out.OutToken, out.Value
	if !req.Write && rec.Out != OK {
		rec.OutToken, rec.OutValue = ownership.Token{}, ""
	}
	// Applied, but the answer may be lost: the caller can't know.
	lost := rec.Out == OK && n.ambiguous.Load() && n.rng.float() < 0.3
	if lost {
		rec.Out = Unknown
	}
	cl.hist.Add(rec)
	if held {
		cl.mu.Lock()
		cl.held = append(cl.held, rec)
		cl.mu.Unlock()
	}
	if lost {
		return reply{}, status.Error(codes.Unavailable, "chaos: answer lost")
	}
	switch rec.Out {
	case OK:
		cl.mu.Lock()
		cl.okTokens[t]++
		cl.mu.Unlock()
		return out, nil
	case Stale:
		cl.stale.Add(1)
		cl.mu.Lock()
		tk := t
		tk.MAC = [ownership.MACSize]byte{}
		if _, ok := cl.staleAt[tk]; !ok {
			cl.staleAt[tk] = rec.End
		}
		cl.mu.Unlock()
		return reply{}, err // the guard reports it (ReportStale) and answers "handoff"
	case Unknown:
		return reply{}, status.Error(codes.Unavailable, "chaos: "+err.Error())
	}
	return reply{}, err
}

// owners is the clients' view of the cluster: each call asks a running
// node chosen at random, as a client of a real service asks whichever
// node it is connected to.
type owners struct {
	cl  *cluster
	rng *lockedRand
}

func (o owners) pick() *coordinator.Coordinator {
	o.cl.mu.Lock()
	defer o.cl.mu.Unlock()
	var cs []*coordinator.Coordinator
	for _, n := range o.cl.nodes {
		if !n.stopped.Load() {
			cs = append(cs, n.c)
		}
	}
	if len(cs) == 0 {
		return nil
	}
	slices.SortFunc(cs, func(a, b *coordinator.Coordinator) int { return strings.Compare(a.Self().Name, b.Self().Name) })
	return cs[int(o.rng.float()*float64(len(cs)))%len(cs)]
}

func (o owners) Owner(key []byte) (ownership.OwnerInfo, error) {
	c := o.pick()
	if c == nil {
		return ownership.OwnerInfo{}, ownership.ErrNoOwner
	}
	return c.Owner(key)
}

func (o owners) Members() []ownership.Member {
	if c := o.pick(); c != nil {
		return c.Members()
	}
	return nil
}

// Subscribe has no events to give: the views are many nodes'; the router's
// follower checks them every FollowInterval.
func (o owners) Subscribe(int) (<-chan coordinator.Event, func()) { return nil, func() {} }

func (cl *cluster) router(seed uint64) *routing.Router {
	o := owners{cl: cl, rng: &lockedRand{r: rand.New(rand.NewPCG(seed, 2))}}
	r, err := routing.NewRouter(routing.RouterConfig{
		Owners:      o,
		Membership:  o,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		MaxAttempts: 60,
	})
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = r.Close() })
	return r
}

// call makes one routed call and records it.
func (cl *cluster) call(ctx context.Context, r *routing.Router, client int, key string, write bool, value string) clientOp {
	op := clientOp{client: client, key: key, write: write, value: value, start: Now()}
	b, _ := json.Marshal(request{Write: write, Value: value, Client: client})
	cctx, cancel := context.WithTimeout(transport.WithKey(ctx, []byte(key)), 15*time.Second)
	defer cancel()
	out := new(wrapperspb.BytesValue)
	op.err = r.Invoke(cctx, methodDo, wrapperspb.Bytes(b), out)
	if op.err == nil {
		op.err = json.Unmarshal(out.Value, &op.rep)
	}
	op.end = Now()
	cl.mu.Lock()
	cl.ops = append(cl.ops, op)
	cl.mu.Unlock()
	return op
}

// workload runs clients until ctx ends: each calls every few milliseconds
// (a paced loop), three writes of a unique value for one read, on keys
// spread over every partition.
func (cl *cluster) workload(ctx context.Context) (wait func()) {
	keys := cl.keyList()
	var wg sync.WaitGroup
	for i := range cl.cfg.clients {
		r := cl.router(cl.cfg.seed + uint64(i))
		rng := rand.New(rand.NewPCG(cl.cfg.seed, uint64(i)+100))
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(8 * time.Millisecond)
			defer tick.Stop()
			for seq := 0; ; seq++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				key := keys[rng.IntN(len(keys))]
				write := rng.IntN(4) != 0
				cl.call(ctx, r, i, key, write, fmt.Sprintf("c%d-%d", i, seq))
			}
		}()
	}
	return wg.Wait
}

// findKeys finds a key for every partition.
func (cl *cluster) findKeys() {
	t := cl.live()[0].c.Table()
	keys := map[uint32]string{}
	for i := 0; len(keys) < cl.cfg.partitions && i < 100000; i++ {
		k := fmt.Sprintf("key-%d", i)
		p, _ := t.LookupString(k)
		if _, ok := keys[uint32(p)]; !ok {
			keys[uint32(p)] = k
		}
	}
	if len(keys) < cl.cfg.partitions {
		cl.t.Fatalf("found keys for %d partitions only", len(keys))
	}
	cl.keys = keys
}

func (cl *cluster) keyList() []string {
	out := make([]string, 0, len(cl.keys))
	for p := range uint32(cl.cfg.partitions) {
		out = append(out, cl.keys[p])
	}
	return out
}

// settled reports nil when every running node sees all the others, they
// agree on the table, and each partition has exactly one live lease, held
// by its ring owner, whose token is the resource's mark.
func (cl *cluster) settled(ctx context.Context) error {
	live := cl.live()
	var fp uint64
	var table *ring.Table
	for i, n := range live {
		t := n.c.Table()
		if t == nil || t.Len() != len(live) {
			return fmt.Errorf("%s sees %d members, want %d", n.name, t.Len(), len(live))
		}
		if i == 0 {
			fp, table = t.Fingerprint(), t
		} else if t.Fingerprint() != fp {
			return fmt.Errorf("%s has another table", n.name)
		}
	}
	for p := range cl.cfg.partitions {
		owner := table.Owner(uint32(p))
		var holders []string
		var tok ownership.Token
		for _, n := range live {
			if l, err := n.c.LeaseOfPartition(uint32(p)); err == nil {
				holders = append(holders, n.name)
				tok = l.Token()
			}
		}
		if len(holders) != 1 || holders[0] != owner {
			return fmt.Errorf("partition %d: lease holders %v, ring owner %s", p, holders, owner)
		}
		mark, err := cl.res.mark(ctx, uint32(p))
		if err != nil {
			return err
		}
		if mark.Compare(tok) != 0 {
			return fmt.Errorf("partition %d: mark %v, lease %v", p, mark, tok)
		}
	}
	return nil
}

// waitSettled polls settled until it holds or bound passes.
func (cl *cluster) waitSettled(ctx context.Context, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var why error
	if tenuretest.Poll(wctx, func() bool { why = cl.settled(ctx); return why == nil }) == nil {
		return time.Since(start), nil
	}
	if ctx.Err() != nil {
		return time.Since(start), fmt.Errorf("%w: %v", ctx.Err(), why)
	}
	return time.Since(start), fmt.Errorf("not settled within %v: %v", bound, why)
}

// waitFor reports whether cond held before ctx ended or bound passed: a
// bounded tenuretest.Poll for the waits whose timeout is an outcome, not a
// failure.
func waitFor(ctx context.Context, bound time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	return tenuretest.Poll(ctx, cond) == nil
}

// hold keeps a fault in place for d (a timed fault, not a wait for a
// condition).
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// The cluster's own checks flag what they must, and only that: a new
// epoch for a partition its node still holds a live lease on, a call
// served under a lease that had ended, a stale-rejected lease left live.
func TestClusterChecks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := &cluster{
		t:       t,
		grants:  map[ownership.Token]int{},
		leases:  map[ownership.Token]*ownership.Lease{},
		byPart:  map[uint32][]*ownership.Lease{},
		endedAt: map[*ownership.Lease]int64{},
		staleAt: map[ownership.Token]int64{},
	}
	tk := func(p uint32, epoch uint64, owner string) ownership.Token {
		return ownership.Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: 1}
	}
	want := func(n int, after string) {
		t.Helper()
		cl.mu.Lock()
		defer cl.mu.Unlock()
		if len(cl.viol) != n {
			t.Fatalf("after %s: violations %q, want %d", after, cl.viol, n)
		}
	}
	l := ownership.NewLease(ctx, tk(1, 1, "a"))
	if err := cl.acquired(ctx, l); err != nil {
		t.Fatal(err)
	}
	cl.onFence(tk(1, 2, "b"))
	cl.onFence(tk(2, 2, "a"))
	cl.onClaim(claimRec{Token: tk(1, 3, "a"), Err: "conflict"})
	cl.checkServing("a", l, Now())
	want(0, "another node's fence, another partition, a failed claim, a live lease served")
	cl.onClaim(claimRec{Token: tk(1, 3, "a")})
	cl.onFence(tk(1, 3, "a"))
	if err := cl.acquired(ctx, ownership.NewLease(ctx, tk(1, 3, "a"))); err != nil {
		t.Fatal(err)
	}
	want(3, "a new epoch minted, fenced and granted while the node's lease was live")

	cl.staleAt[tk(1, 1, "a")] = Now()
	if len(cl.checkFencedEnded()) != 1 {
		t.Fatal("a live lease rejected as stale was not flagged")
	}
	l.End(nil)
	if !waitFor(ctx, 5*time.Second, func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		_, ok := cl.endedAt[l]
		return ok
	}) {
		t.Fatal("the lease's end was not recorded")
	}
	if v := cl.checkFencedEnded(); len(v) != 0 {
		t.Fatalf("an ended lease flagged: %q", v)
	}
	cl.checkServing("a", l, Now())
	want(4, "a call served under an ended lease")
	cl.onFence(tk(1, 4, "a"))
	want(5, "a new epoch while the node's other lease (epoch 3) is live")
}
