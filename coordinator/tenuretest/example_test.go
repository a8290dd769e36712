package tenuretest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
)

// A user's test of their Handler: it drains on Leave while its lease is
// still live, and after a partition the old owner's late write is fenced.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The Handler under test records, for each Release, whether the lease
	// was still live when it was asked to drain.
	var mu sync.Mutex
	drainedLive := map[string][]bool{}
	handler := func(name string) coordinator.Handler {
		return coordinator.HandlerFuncs{
			ReleaseFunc: func(ctx context.Context, l *ownership.Lease) error {
				mu.Lock()
				defer mu.Unlock()
				drainedLive[name] = append(drainedLive[name], l.Err() == nil)
				return nil // drain the partition's writes here
			},
		}
	}
	cl, err := tenuretest.Start(ctx, tenuretest.Config{Nodes: 5, Handler: handler})
	check(err)
	defer cl.Close()
	key := []byte("user-42")

	owner, err := cl.OwnerOf(ctx, key)
	check(err)
	check(cl.Leave(ctx, owner)) // handler(owner)'s Release ran with the lease live
	check(cl.WaitConverged(ctx))

	next, err := cl.OwnerOf(ctx, key)
	check(err)
	lease, err := cl.Node(next).Lease(key)
	check(err)
	check(cl.Pause(next))                      // cut off, clock stopped: it still believes in its lease
	check(cl.WaitConverged(ctx, cl.Live()...)) // the others took the key over and fenced it
	fence := cl.Fence().(*ownership.MemoryFence)
	err = fence.Do(ctx, lease.Token(), ownership.Exact, func() error { return nil }) // its late write
	fmt.Println("the cut-off owner's write is fenced:", errors.Is(err, ownership.ErrStaleToken))

	mu.Lock()
	live := len(drainedLive[owner]) > 0
	for _, l := range drainedLive[owner] {
		live = live && l
	}
	mu.Unlock()
	fmt.Println("drained on leave with the lease live:", live)

	check(cl.Resume(next))
	fmt.Println("converged after the heal:", cl.WaitConverged(ctx) == nil)
	// Output:
	// the cut-off owner's write is fenced: true
	// drained on leave with the lease live: true
	// converged after the heal: true
}

// check stops the example at an error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}
