package coordinator_test

import (
	"context"
	"errors"
	"log"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// loadShard stands for the application's work on acquire: read the
// partition's state (the fence is already raised).
func loadShard(ctx context.Context, l *ownership.Lease) error { return nil }

// drainShard stands for the application's work on release: finish or
// cancel the partition's writes in flight.
func drainShard(ctx context.Context, l *ownership.Lease) error { return nil }

// write stands for the application's write of key.
func write(key []byte) error { return nil }

// A node of a cluster on a LAN: seeded with a peer, fenced with a memory
// fence, writing one key under its lease. (Compiled, not run: it needs the
// peer.)
func Example_tour() {
	ctx := context.Background()
	key := []byte("user:42")

	fence, _ := ownership.NewMemoryFence(271) // or a *sqlfence.Fence for a SQL database
	cfg := coordinator.LANConfig()
	cfg.Name = "node-1"
	cfg.ServiceAddr = "10.0.0.1:9000" // gossiped: where Owner(key) sends callers
	cfg.Seeds = []string{"10.0.0.2:7946"}
	cfg.Fence = fence // fenced with every new token before Acquire
	cfg.Handler = coordinator.HandlerFuncs{
		AcquireFunc: func(ctx context.Context, l *ownership.Lease) error { return loadShard(ctx, l) },
		ReleaseFunc: func(ctx context.Context, l *ownership.Lease) error { return drainShard(ctx, l) },
	}
	c, _ := coordinator.New(cfg) // does not touch the network
	_ = c.Start(ctx)             // gossip, join, claim
	defer c.Leave(ctx)           // hand off, then leave

	lease, err := c.Lease(key) // *ownership.NotOwnerError names the owner
	if err != nil {
		log.Print(err)
		return
	}
	err = fence.Do(ctx, lease.Token(), ownership.Exact, func() error { return write(key) })
	if errors.Is(err, ownership.ErrStaleToken) {
		c.ReportStale(err) // the lease ends at once
	}
}
