package coordinator_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// A single node that owns every partition, fences an in-process resource
// on acquire and writes under the lease's token.
func Example() {
	fence, err := ownership.NewMemoryFence(271)
	if err != nil {
		panic(err)
	}
	cfg := coordinator.LocalConfig()
	cfg.Name = "node-1"
	cfg.Fence = fence // fenced with each new token before Acquire
	cfg.Handler = coordinator.HandlerFuncs{
		AcquireFunc: func(ctx context.Context, l *ownership.Lease) error {
			// Load the partition's state here: the fence is already raised.
			return nil
		},
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Close()
	if err := c.WaitConverged(ctx); err != nil {
		panic(err)
	}

	key := []byte("user:42")
	lease, err := c.Lease(key)
	if err != nil {
		panic(err)
	}
	err = fence.Do(ctx, lease.Token(), ownership.Exact, func() error {
		return nil // the write, atomic with the token check
	})
	fmt.Println("write:", err)
	fmt.Println("owner:", lease.Token().Owner)
	if err := c.Leave(ctx); err != nil {
		panic(err)
	}
	fmt.Println("lease after leave:", lease.Err() != nil)
	// Output:
	// write: <nil>
	// owner: node-1
	// lease after leave: true
}
