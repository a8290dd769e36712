package kvnode

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gate"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/routing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"
)

// stopTimeout bounds the graceful stop of the gRPC and HTTP servers: calls
// still running after it are cancelled.
const stopTimeout = 5 * time.Second

// A Node is one running kvstore node: a coordinator, the KV gRPC service,
// the shared database and the status server. Its methods are safe for
// concurrent use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	db    *sql.DB
	fence *sqlfence.Fence
	c     *coordinator.Coordinator

	router *routing.Router
	client kvpb.KVClient               // through the router: calls go to each key's owner
	guard  grpc.UnaryServerInterceptor // the OwnerGuard's
	health *routing.Health
	grpc   *grpc.Server
	status *http.Server
	reqs   *sqlfence.Requests // the request ids of the writes applied
	batch  *sqlfence.Batcher  // commits each partition's writes in batches

	grpcLis, statusLis   net.Listener
	grpcAddr, statusAddr string

	// gate holds off a partition's Release until its writes in flight
	// have finished (the drain that makes a handoff reject nothing).
	gate       *gate.Gate
	partitions int // of the ring
	stats      counters

	serving sync.WaitGroup // the servers' Serve goroutines
	once    sync.Once
}

type counters struct {
	putsApplied, duplicates, gets, staleRejected, forwarded atomic.Uint64
	batches, batchedWrites, batchesFailed                   atomic.Uint64
	// batchWait counts batches by their longest queue wait: bucket i
	// holds the waits of less than 2^i µs (and at least 2^(i-1) µs), the
	// last one every longer wait.
	batchWait [batchWaitBuckets]atomic.Uint64
}

// batchWaitBuckets is the number of power-of-two buckets of
// Stats.BatchWaitLog2: the last starts at 2^30 µs, about 18 minutes.
const batchWaitBuckets = 32

// observeBatch counts a batch the Batcher sent.
func (c *counters) observeBatch(i sqlfence.BatchInfo) {
	c.batches.Add(1)
	c.batchedWrites.Add(uint64(i.Writes))
	if i.Err != nil {
		c.batchesFailed.Add(1)
	}
	c.batchWait[min(bits.Len64(uint64(i.Wait.Microseconds())), batchWaitBuckets-1)].Add(1)
}

// Stats are a node's counters since Start, as /kv/stats serves them.
type Stats struct {
	// PutsApplied counts writes this node committed as the key's owner.
	PutsApplied uint64 `json:"puts_applied"`
	// Duplicates counts writes this node answered with the first outcome
	// of their request id instead of applying them again.
	Duplicates uint64 `json:"duplicates"`
	// Gets counts reads this node served as the key's owner.
	Gets uint64 `json:"gets"`
	// StaleRejected counts writes the SQL fence refused because a newer
	// owner had fenced the partition.
	StaleRejected uint64 `json:"stale_rejected"`
	// Forwarded counts clients' calls this node passed to another node,
	// the key's owner as this node saw it.
	Forwarded uint64 `json:"forwarded"`
	// Batches counts the fenced transactions the owner's writes went in
	// (sqlfence.Batcher), BatchedWrites the writes they carried, and
	// BatchesFailed the batches that did not commit (refused by the
	// fence, their session or connection lost, their outcome unknown).
	Batches       uint64 `json:"batches"`
	BatchedWrites uint64 `json:"batched_writes"`
	BatchesFailed uint64 `json:"batches_failed"`
	// BatchWaitLog2 counts the batches by the longest time any of their
	// writes waited in the queue: element i counts waits of at least
	// 2^(i-1) µs and less than 2^i µs (element 0: under 1 µs), the last
	// element every longer wait. Sum the elements of several nodes to
	// merge them.
	BatchWaitLog2 []uint64 `json:"batch_wait_us_log2"`
	// Queued is the number of writes waiting in the Batcher's queues, not
	// yet sent, when the Stats were taken.
	Queued int `json:"queued"`
}

// Start opens the database, creates the tables if needed, starts the
// coordinator (joining cfg.Seeds) and serves KV over gRPC and the status
// page over HTTP. ctx bounds the start only; the node runs until Leave or
// Close.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name)}
	defer func() {
		if err != nil {
			n.stop(false)
		}
	}()

	// The database every node shares, and the fence that guards it.
	var d sqlfence.Dialect
	if n.db, d, err = openDB(cfg.DataPath, cfg.DSN); err != nil {
		return nil, err
	}
	if n.fence, err = sqlfence.New(n.db, d, sqlfence.Config{}); err != nil {
		return nil, err
	}
	if n.reqs, err = sqlfence.NewRequests(d, sqlfence.RequestsConfig{Table: requestsTable}); err != nil {
		return nil, err
	}
	if err = createSchema(ctx, n.db, d, n.fence, n.reqs); err != nil {
		return nil, err
	}
	// The owner of a partition is its only writer: it commits the writes
	// of many clients to the partition in one fenced transaction.
	if n.batch, err = sqlfence.NewBatcher(n.fence, sqlfence.BatchConfig{Requests: n.reqs, Observe: n.stats.observeBatch}); err != nil {
		return nil, err
	}

	// Listen first: the coordinator gossips the gRPC address.
	if n.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("kvnode: listen gRPC: %w", err)
	}
	n.grpcAddr = n.grpcLis.Addr().String()
	if cfg.StatusAddr != "" {
		if n.statusLis, err = net.Listen("tcp", cfg.StatusAddr); err != nil {
			return nil, fmt.Errorf("kvnode: listen status: %w", err)
		}
		n.statusAddr = n.statusLis.Addr().String()
	}

	if n.c, err = n.newCoordinator(); err != nil {
		return nil, err
	}
	if err = n.c.Start(ctx); err != nil {
		return nil, err
	}

	// The gRPC side: a router for the calls this node forwards, the guard
	// for the calls it serves as owner.
	ka := transport.DefaultKeepalive()
	dial := append(ka.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	n.router, err = routing.NewRouter(routing.RouterConfig{
		Owners:      n.c,
		Membership:  n.c,
		DialOptions: append(dial, cfg.DialOptions...),
		// A Get may run twice; a Put only with a request id (which the
		// router sees in the call's metadata).
		Idempotent: func(method string) bool { return method == kvpb.KV_Get_FullMethodName },
	})
	if err != nil {
		return nil, err
	}
	n.client = kvpb.NewKVClient(n.router)
	guard, err := routing.NewGuard(routing.GuardConfig{Leases: n.c, Stale: n.c, RequestKey: requestKey})
	if err != nil {
		return nil, err
	}
	n.guard = guard.Unary()
	n.grpc = grpc.NewServer(append(ka.ServerOptions(), grpc.ChainUnaryInterceptor(n.intercept))...)
	kvpb.RegisterKVServer(n.grpc, kvServer{n: n})
	n.health = routing.NewHealth(n.c, kvpb.KV_ServiceDesc.ServiceName)
	n.health.Register(n.grpc)
	// Programs in other languages ask any node who owns a key (Ownership)
	// and discover the services and their messages (server reflection).
	own, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: n.c})
	if err != nil {
		return nil, err
	}
	own.Register(n.grpc)
	reflection.Register(n.grpc)
	n.serve(func() error { return n.grpc.Serve(n.grpcLis) })

	if n.statusLis != nil {
		if n.status, err = n.statusServer(); err != nil {
			return nil, err
		}
		n.serve(func() error { return n.status.Serve(n.statusLis) })
	}
	n.log.Info("serving", "gossip", n.c.GossipAddr(), "grpc", n.grpcAddr, "status", n.statusAddr, "database", d)
	return n, nil
}

// newCoordinator builds the coordinator: the SQL fence is both its fence
// (fenced before each Acquire) and its authority (epochs minted by the
// database: dense, and one node per epoch).
func (n *Node) newCoordinator() (*coordinator.Coordinator, error) {
	host, port, _ := splitHostPort(n.cfg.GossipAddr) // checked by withDefaults
	cc := n.cfg.Coordinator
	cc.Name = n.cfg.Name
	cc.BindAddr, cc.BindPort = host, port
	cc.ServiceAddr = n.grpcAddr
	cc.Seeds = n.cfg.Seeds
	cc.GossipKeys = nil
	if len(n.cfg.GossipKey) > 0 {
		cc.GossipKeys = [][]byte{n.cfg.GossipKey}
	}
	cc.Handler = coordinator.HandlerFuncs{AcquireFunc: n.acquire, ReleaseFunc: n.release}
	cc.Fence = n.fence
	cc.Authority = n.fence.Authority()
	cc.Logger = n.cfg.Logger
	if err := cc.Validate(); err != nil {
		return nil, err
	}
	partitions := cc.Ring.Partitions
	if cc.Ring == (ring.Config{}) {
		partitions = ring.DefaultConfig().Partitions // the coordinator's default
	}
	n.gate, n.partitions = gate.New(partitions), partitions
	return coordinator.New(cc)
}

func (n *Node) serve(fn func() error) {
	n.serving.Add(1)
	go func() {
		defer n.serving.Done()
		if err := fn(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("server stopped", "err", err)
		}
	}()
}

// acquire is called when this node is granted a partition, after the
// coordinator fenced the database with the lease's token: from now on no
// write under an older token can commit. It opens the partition's gate
// to writes under this lease.
func (n *Node) acquire(_ context.Context, l *ownership.Lease) error {
	return n.gate.Open(l)
}

// release is called for every lease that ends: before it ends when the
// partition moves away (a planned move), after it ended when it was lost.
// It closes the gate and waits for the writes in flight to finish, so the
// next owner's fence rejects none of them. The coordinator cancels the
// lease (and so any write still waiting) if this takes longer than its
// ReleaseTimeout. The writes of a lease that was lost and are still
// queued in the Batcher fail at once with ErrLeaseEnded, which the router
// retries at the next owner: nothing of them was sent.
func (n *Node) release(ctx context.Context, l *ownership.Lease) error {
	if l.Err() != nil && n.batch != nil {
		n.batch.Cancel(l.Token())
	}
	return n.gate.Close(ctx, l)
}

// Leave hands this node's partitions off to the others (each partition's
// writes in flight finish first) and leaves the cluster, while the node
// keeps serving: its health service answers NOT_SERVING from the start, so
// balanced clients move to other nodes, and the calls that still arrive
// are forwarded to the new owners. Once the coordinator's Leave returns
// (the new owners hold every partition), it stops the gRPC server
// gracefully: the calls in flight finish, within stopTimeout. Then it
// closes the database. If ctx ends first, the remaining leases are revoked
// as in Close and ctx's error is returned.
func (n *Node) Leave(ctx context.Context) error {
	err := coordinator.ErrClosed
	n.once.Do(func() {
		err = n.c.Leave(ctx)
		n.stop(true)
	})
	return err
}

// Close stops the node at once, as a crash looks to the others: no
// handoff; they take its partitions over after failure detection and
// their grace period. It is idempotent.
func (n *Node) Close() error {
	n.once.Do(func() {
		n.c.Close()
		n.stop(false)
	})
	return nil
}

// stop stops serving and closes everything Start opened, in reverse order.
// graceful lets calls in flight finish, within stopTimeout.
func (n *Node) stop(graceful bool) {
	if n.c != nil {
		n.c.Close() // after Leave, a no-op
	}
	if n.grpc != nil {
		if graceful {
			done := make(chan struct{})
			go func() { n.grpc.GracefulStop(); close(done) }()
			t := time.NewTimer(stopTimeout)
			select {
			case <-done:
			case <-t.C:
				n.grpc.Stop()
				<-done
			}
			t.Stop()
		} else {
			n.grpc.Stop()
		}
	}
	if n.status != nil {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		if !graceful || n.status.Shutdown(ctx) != nil {
			n.status.Close()
		}
		cancel()
	}
	n.serving.Wait()
	for _, l := range []net.Listener{n.grpcLis, n.statusLis} {
		if l != nil {
			l.Close() // closed already if served; not if Start failed
		}
	}
	if n.router != nil {
		n.router.Close()
	}
	if n.health != nil {
		n.health.Close()
	}
	if n.batch != nil {
		n.batch.Close()
	}
	if n.fence != nil {
		n.fence.Close()
	}
	if n.db != nil {
		n.db.Close()
	}
}

// Coordinator returns the node's coordinator, for its Status, Owner and
// events.
func (n *Node) Coordinator() *coordinator.Coordinator { return n.c }

// GossipAddr returns the address other nodes join this one at.
func (n *Node) GossipAddr() string { return n.c.GossipAddr() }

// GRPCAddr returns the address the KV service listens at.
func (n *Node) GRPCAddr() string { return n.grpcAddr }

// StatusAddr returns the status server's address, or "" without one.
func (n *Node) StatusAddr() string { return n.statusAddr }

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	wait := make([]uint64, batchWaitBuckets)
	for i := range wait {
		wait[i] = n.stats.batchWait[i].Load()
	}
	queued := 0
	for p := range n.partitions {
		queued += n.batch.Queued(uint32(p))
	}
	return Stats{
		BatchWaitLog2: wait,
		Queued:        queued,
		PutsApplied:   n.stats.putsApplied.Load(),
		Duplicates:    n.stats.duplicates.Load(),
		Gets:          n.stats.gets.Load(),
		StaleRejected: n.stats.staleRejected.Load(),
		Forwarded:     n.stats.forwarded.Load(),
		Batches:       n.stats.batches.Load(),
		BatchedWrites: n.stats.batchedWrites.Load(),
		BatchesFailed: n.stats.batchesFailed.Load(),
	}
}
