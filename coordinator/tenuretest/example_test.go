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
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	key := []byte("user-42")

	// A graceful leave: every partition drains before its lease ends.
	owner, err := cl.OwnerOf(ctx, key)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.Leave(ctx, owner); err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.WaitConverged(ctx); err != nil {
		fmt.Println(err)
		return
	}
	mu.Lock()
	live := len(drainedLive[owner]) > 0
	for _, l := range drainedLive[owner] {
		live = live && l
	}
	mu.Unlock()
	fmt.Println("drained on leave with the lease live:", live)

	// A partition: the key's owner is cut off (paused, so it still
	// believes in its lease); the others take the key over and fence it.
	next, err := cl.OwnerOf(ctx, key)
	if err != nil {
		fmt.Println(err)
		return
	}
	lease, err := cl.Node(next).Lease(key)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.Pause(next); err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.WaitConverged(ctx, cl.Live()...); err != nil {
		fmt.Println(err)
		return
	}
	fence := cl.Fence().(*ownership.MemoryFence)
	err = fence.Do(ctx, lease.Token(), ownership.Exact, func() error { return nil }) // its late write
	fmt.Println("the cut-off owner's write is fenced:", errors.Is(err, ownership.ErrStaleToken))

	if err := cl.Resume(next); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("converged after the heal:", cl.WaitConverged(ctx) == nil)
	// Output:
	// drained on leave with the lease live: true
	// the cut-off owner's write is fenced: true
	// converged after the heal: true
}
