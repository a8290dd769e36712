package gossip_test

import (
	"context"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// A node takes the next epoch above everything gossip and the fence told it.
func ExampleAuthority() {
	reg, _ := gossip.NewRegister(16)
	auth, _ := gossip.NewAuthority(reg, nil)

	// Gossip brought a claim for partition 5 at epoch 3.
	reg.Observe(ownership.Token{Partition: 5, Epoch: 3, Owner: "node-b", Incarnation: 2})

	me := ownership.Node{Name: "node-a", Incarnation: 1}
	tok, _ := auth.Claim(context.Background(), 5, me, ownership.Token{})
	fmt.Println(tok)
	// Output:
	// p5@e4:node-a/0000000000000001
}
