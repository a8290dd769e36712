package ring_test

import (
	"fmt"

	"github.com/tenure-go/tenure/ring"
)

func ExampleNew() {
	table, err := ring.New([]string{"node-c", "node-a", "node-b"}, ring.DefaultConfig())
	if err != nil {
		fmt.Println(err)
		return
	}
	partition, owner := table.LookupString("user:42")
	fmt.Println(partition, owner)
	fmt.Println(table.Members(), table.Partitions())
	fmt.Println(table.Share("node-a")+table.Share("node-b")+table.Share("node-c") == table.Partitions())
	// Output:
	// 195 node-a
	// [node-a node-b node-c] 271
	// true
}

func ExampleNew_invalid() {
	_, err := ring.New([]string{"node-a", "node-a"}, ring.DefaultConfig())
	fmt.Println(err)
	_, err = ring.New(nil, ring.DefaultConfig())
	fmt.Println(err)
	_, err = ring.New([]string{"node-a"}, ring.Config{})
	fmt.Println(err)
	// Output:
	// ring: duplicate member name: "node-a"
	// ring: no members
	// ring: invalid config: Partitions 0 not in [1, 1048576]
}

func ExampleDiff() {
	cfg := ring.Config{Partitions: 16, VirtualNodes: 200, Load: 1.25}
	before, _ := ring.New([]string{"node-a", "node-b", "node-c"}, cfg)
	after, _ := ring.New([]string{"node-a", "node-b", "node-c", "node-d"}, cfg)
	for _, m := range ring.Diff(before, after) {
		fmt.Printf("partition %d: %s -> %s\n", m.Partition, m.From, m.To)
	}
	// Output:
	// partition 2: node-b -> node-d
	// partition 6: node-a -> node-d
	// partition 11: node-a -> node-d
	// partition 12: node-b -> node-d
}

func ExampleTable_Replicas() {
	table, _ := ring.New([]string{"node-a", "node-b", "node-c", "node-d"}, ring.DefaultConfig())
	p := table.PartitionString("user:42")
	fmt.Println(table.Owner(p), table.Replicas(p, 3))
	// Output:
	// node-a [node-a node-b node-d]
}

func ExampleHolder() {
	// The zero Holder is ready: it holds no Table until the first Store.
	var current ring.Holder
	_, owner := current.Load().LookupString("order:7")
	fmt.Printf("before any table: %q\n", owner)

	// The membership goroutine publishes each new Table...
	table, _ := ring.New([]string{"node-a", "node-b"}, ring.DefaultConfig())
	current.Store(table)

	// ...and request handlers read the current one without locking.
	_, owner = current.Load().LookupString("order:7")
	fmt.Println("after:", owner)
	// Output:
	// before any table: ""
	// after: node-b
}

// A producer that is not a member partitions its keys with the cluster's
// partition count.
func ExamplePartition() {
	fmt.Println(ring.PartitionString("user:42", 271))
	fmt.Println(ring.Partition([]byte("user:42"), 271))
	// Output:
	// 195
	// 195
}
