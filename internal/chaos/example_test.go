package chaos_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/tenure-go/tenure/internal/chaos"
	"github.com/tenure-go/tenure/ownership"
)

// A SkewClock runs fast, slow or jumps, to give one node of a test cluster
// a clock that disagrees with the others'. A forward jump of at least a
// ticker's interval fires the ticker at once.
func ExampleSkewClock() {
	c := chaos.NewSkewClock()
	start := c.Now()
	c.Jump(time.Hour)
	fmt.Println("an hour ahead:", c.Now().Sub(start) >= time.Hour)

	c.SetRate(1000)
	fmt.Println("rate:", c.Rate()) // clamped to 100

	ticks, stop := c.NewTicker(time.Minute)
	defer stop()
	c.Jump(time.Minute)
	select {
	case <-ticks:
		fmt.Println("ticked after the jump")
	case <-time.After(10 * time.Second):
		fmt.Println("no tick")
	}
	// Output:
	// an hour ahead: true
	// rate: 100
	// ticked after the jump
}

// Check decides whether the records of a run could have come from a
// fenced register: here node a's write after node b fenced is refused,
// as the fence must, and then a history where it was applied.
func ExampleCheck() {
	a := ownership.Token{Partition: 7, Epoch: 1, Owner: "a", Incarnation: 1}
	b := ownership.Token{Partition: 7, Epoch: 2, Owner: "b", Incarnation: 1}
	history := func(lateWrite chaos.Outcome) []chaos.Record {
		return []chaos.Record{
			{Client: 1, Node: "a", Kind: chaos.Fence, Token: a, Out: chaos.OK, Start: 0, End: 1},
			{Client: 1, Node: "a", Kind: chaos.Write, Token: a, Value: "x", Out: chaos.OK, Start: 2, End: 3},
			{Client: 2, Node: "b", Kind: chaos.Fence, Token: b, Out: chaos.OK, Start: 4, End: 5},
			{Client: 1, Node: "a", Kind: chaos.Write, Token: a, Value: "late", Out: lateWrite, Start: 6, End: 7},
			{Client: 2, Node: "b", Kind: chaos.Read, Token: b, Out: chaos.OK, OutToken: a, OutValue: "x", Start: 8, End: 9},
		}
	}
	// An illegal history's visualization is written into dir.
	dir, err := os.MkdirTemp("", "chaos-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, late := range []chaos.Outcome{chaos.Stale, chaos.OK} {
		res, err := chaos.Check(history(late), 10*time.Second, dir)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("late write %v: %d partition, illegal %v, visualization written: %v\n",
			late, res.Partitions, res.Illegal, res.Visualization != "")
	}
	// Output:
	// late write stale: 1 partition, illegal [], visualization written: false
	// late write ok: 1 partition, illegal [7], visualization written: true
}
