package etcdfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
)

// An owner claims partition 3 from the etcd authority (a claim is a
// fence) and writes under its token; once a newer owner claims, the old
// owner's writes are refused. It needs an etcd server on 127.0.0.1:2379.
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b [4]byte
	rand.Read(b[:])
	prefix := "example/" + hex.EncodeToString(b[:]) + "/"
	defer cli.Delete(context.Background(), prefix, clientv3.WithPrefix())

	fence, err := etcdfence.New(cli, etcdfence.Config{Prefix: prefix + "fence/"})
	if err != nil {
		panic(err)
	}
	auth := fence.Authority()
	a, err := auth.Claim(ctx, 3, ownership.Node{Name: "node-a", Incarnation: 1}, ownership.Token{})
	if err != nil {
		panic(err)
	}
	deposit := func(t ownership.Token, v string) error {
		_, err := fence.Do(ctx, t, ownership.Exact, clientv3.OpPut(prefix+"balance/alice", v))
		return err
	}
	fmt.Println("node-a, epoch", a.Epoch, "writes:", deposit(a, "10"))

	// node-b takes over; node-a, paused until now, tries again.
	bTok, err := auth.Claim(ctx, 3, ownership.Node{Name: "node-b", Incarnation: 2}, a)
	if err != nil {
		panic(err)
	}
	var stale *ownership.StaleTokenError
	if errors.As(deposit(a, "99"), &stale) {
		fmt.Println("node-a refused; the partition belongs to", stale.Current.Owner, "in epoch", stale.Current.Epoch)
	}
	fmt.Println("node-b writes:", deposit(bTok, "15"))
	resp, err := cli.Get(ctx, prefix+"balance/alice")
	if err != nil {
		panic(err)
	}
	fmt.Println("alice:", string(resp.Kvs[0].Value))
	// Output:
	// node-a, epoch 1 writes: <nil>
	// node-a refused; the partition belongs to node-b in epoch 2
	// node-b writes: <nil>
	// alice: 15
}
