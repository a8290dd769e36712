package etcdfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
)

// Do runs an owner's operations in one etcd transaction with a compare
// on the partition's mark: reads and writes both happen under the fence,
// or not at all. It needs an etcd server on 127.0.0.1:2379.
func ExampleFence_Do() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b [4]byte
	rand.Read(b[:])
	prefix := "example/" + hex.EncodeToString(b[:]) + "/" // a fresh key space for each run
	p, me, seen := uint32(3), ownership.Node{Name: "node-1", Incarnation: 1}, ownership.Token{}
	key, value, other := "user:42", "hi", "user:7"

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	check(err)
	defer cli.Close()
	fence, err := etcdfence.New(cli, etcdfence.Config{Prefix: prefix + "fence/"})
	check(err)
	tok, err := fence.Authority().Claim(ctx, p, me, seen) // a claim is also a fence
	check(err)
	resp, err := fence.Do(ctx, tok, ownership.Exact,
		clientv3.OpPut(prefix+"data/"+key, value),
		clientv3.OpGet(prefix+"data/"+other)) // reads under the fence too
	// errors.Is(err, ownership.ErrStaleToken): a newer owner exists
	check(err)
	defer cli.Delete(context.Background(), prefix, clientv3.WithPrefix())
	fmt.Println("epoch", tok.Epoch, "write:", err, "read", other+":", len(resp.Responses[1].GetResponseRange().Kvs), "keys")

	// Another node claims the partition; the first one's next write is refused.
	if _, err := fence.Authority().Claim(ctx, p, ownership.Node{Name: "node-2", Incarnation: 2}, tok); err != nil {
		panic(err)
	}
	_, err = fence.Do(ctx, tok, ownership.Exact, clientv3.OpPut(prefix+"data/"+key, "late"))
	fmt.Println("stale:", errors.Is(err, ownership.ErrStaleToken))
	// Output:
	// epoch 1 write: <nil> read user:7: 0 keys
	// stale: true
}

// check stops an example at an error.
func check(err error) {
	if err != nil {
		panic(err)
	}
}
