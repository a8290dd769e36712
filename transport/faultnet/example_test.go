package faultnet_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// A three-node memberlist cluster over a fault network: partition it, wait
// for each side to declare the other dead, heal it and join again.
func Example() {
	network := faultnet.New(faultnet.WithSeed(42))

	start := func(name string) (*memberlist.Memberlist, *faultnet.Transport, error) {
		tr, err := network.Transport(name, faultnet.TransportConfig{})
		if err != nil {
			return nil, nil, err
		}
		conf := memberlist.DefaultLocalConfig()
		conf.Name = name
		conf.Transport = tr
		conf.BindAddr = "127.0.0.1"
		conf.BindPort = tr.Port()
		conf.AdvertisePort = tr.Port()
		conf.ProbeInterval = 100 * time.Millisecond
		conf.ProbeTimeout = 50 * time.Millisecond
		conf.SuspicionMaxTimeoutMult = 2
		conf.Logger = log.New(io.Discard, "", 0)
		ml, err := memberlist.Create(conf)
		if err != nil {
			_ = tr.Shutdown()
			return nil, nil, err
		}
		return ml, tr, nil
	}

	var nodes []*memberlist.Memberlist
	defer func() {
		for _, ml := range nodes {
			_ = ml.Shutdown() // a crash; Leave first for a graceful exit
		}
	}()
	var seed string
	for _, name := range []string{"a", "b", "c"} {
		ml, tr, err := start(name)
		if err != nil {
			fmt.Println(err)
			return
		}
		nodes = append(nodes, ml)
		if seed == "" {
			seed = tr.Addr()
		} else if _, err := ml.Join([]string{seed}); err != nil {
			fmt.Println(err)
			return
		}
	}

	// waitFor polls each node's member count, with a deadline.
	waitFor := func(want ...int) bool {
		deadline := time.Now().Add(30 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for time.Now().Before(deadline) {
			ok := true
			for i, ml := range nodes {
				ok = ok && ml.NumMembers() == want[i]
			}
			if ok {
				return true
			}
			<-tick.C
		}
		return false
	}
	fmt.Println("joined:", waitFor(3, 3, 3))

	if err := network.Partition([]string{"a", "b"}, []string{"c"}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("split {a,b} | {c}:", waitFor(2, 2, 1))

	network.Heal()
	// memberlist never probes dead nodes: join across the healed split.
	addr, _ := network.Addr("c")
	if _, err := nodes[0].Join([]string{addr}); err != nil {
		fmt.Println(err)
	}
	fmt.Println("healed:", waitFor(3, 3, 3))
	// Output:
	// joined: true
	// split {a,b} | {c}: true
	// healed: true
}

// A one-way cut: packets from a to b are lost, packets from b to a arrive,
// and streams, which need both directions, are refused both ways.
func ExampleNetwork_Cut() {
	network := faultnet.New()
	a, err := network.Transport("a", faultnet.TransportConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Shutdown()
	b, err := network.Transport("b", faultnet.TransportConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Shutdown()

	network.Cut("a", "b")
	_, _ = a.WriteTo([]byte("lost"), b.Addr())
	_, _ = b.WriteTo([]byte("hello"), a.Addr())
	select {
	case p := <-a.PacketCh():
		fmt.Printf("a received %q\n", p.Buf)
	case <-time.After(5 * time.Second):
		fmt.Println("a received nothing")
	}
	sent, dropped := network.Stats()
	fmt.Println("sent", sent, "dropped", dropped)

	_, err = b.DialTimeout(a.Addr(), time.Second)
	fmt.Println("b dials a:", errors.Is(err, faultnet.ErrLinkDown))
	// Output:
	// a received "hello"
	// sent 2 dropped 1
	// b dials a: true
}
