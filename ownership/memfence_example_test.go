package ownership_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// A new owner fences the resource before it reads or serves; the old
// owner's next write is then rejected, and the error names the new owner.
func ExampleMemoryFence() {
	ctx := context.Background()
	fence, err := ownership.NewMemoryFence(8)
	if err != nil {
		panic(err)
	}
	old := ownership.Token{Partition: 3, Epoch: 1, Owner: "node-a", Incarnation: 1}
	next := ownership.Token{Partition: 3, Epoch: 2, Owner: "node-b", Incarnation: 7}

	fence.Fence(ctx, old)
	fmt.Println("old owner writes:", fence.Check(old, ownership.Exact))

	mark, _ := fence.Fence(ctx, next) // node-b acquires partition 3
	fmt.Println("mark:", mark)

	err = fence.Check(old, ownership.Exact)
	var stale *ownership.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("old owner rejected; partition now held by", stale.Current.Owner)
	}
	// Output:
	// old owner writes: <nil>
	// mark: p3@e2:node-b/0000000000000007
	// old owner rejected; partition now held by node-b
}

// Do makes the check and the write atomic: once a newer owner's Fence has
// returned, no write under an older token is running or will run.
func ExampleMemoryFence_Do() {
	ctx := context.Background()
	fence, _ := ownership.NewMemoryFence(1)
	tok := ownership.Token{Partition: 0, Epoch: 4, Owner: "node-a", Incarnation: 1}
	fence.Fence(ctx, tok)

	balance := 0
	err := fence.Do(ctx, tok, ownership.Exact, func() error {
		balance += 10 // the protected write
		return nil
	})
	fmt.Println(balance, err)

	fence.Fence(ctx, ownership.Token{Partition: 0, Epoch: 5, Owner: "node-b", Incarnation: 2})
	err = fence.Do(ctx, tok, ownership.Exact, func() error {
		balance += 10
		return nil
	})
	fmt.Println(balance, errors.Is(err, ownership.ErrStaleToken))
	// Output:
	// 10 <nil>
	// 10 true
}
