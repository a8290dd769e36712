package transport_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// A not-owner refusal names the owner; a client follows it.
func ExampleOwnerHint() {
	err := transport.NotOwnerStatus(ownership.OwnerInfo{
		Partition: 7,
		Node:      "node-2",
		Addr:      "10.0.0.2:7000",
		Token:     ownership.Token{Partition: 7, Epoch: 3, Owner: "node-2", Incarnation: 1},
	})
	fmt.Println(status.Code(err))
	if o, ok := transport.OwnerHint(err); ok {
		fmt.Println(o.Node, o.Addr, o.Token.Epoch)
	}
	// Output:
	// FailedPrecondition
	// node-2 10.0.0.2:7000 3
}

// A resource's stale refusal carries its current token, which a node's
// coordinator takes to step down.
func ExampleStaleFromStatus() {
	mine := ownership.Token{Partition: 1, Epoch: 4, Owner: "node-1", Incarnation: 9}
	theirs := ownership.Token{Partition: 1, Epoch: 5, Owner: "node-2", Incarnation: 2}
	err := transport.StatusFromError(ownership.Stale(mine, theirs))

	if st, ok := transport.StaleFromStatus(err); ok {
		fmt.Println(status.Code(err), st.Current.Owner, st.Current.Epoch)
		// coord.ReportStale(st)
	}
	// Output: FailedPrecondition node-2 5
}

// Servers must accept the clients' keepalive pings.
func ExampleKeepalive() {
	k := transport.DefaultKeepalive()
	fmt.Println(k.Validate())
	k.ClientTime = 10 * time.Second // faster than the servers' MinTime
	fmt.Println(k.Validate())
	// Output:
	// <nil>
	// transport: Keepalive.ClientTime is below ServerMinTime: servers would close the clients' connections
}

// An unknown outcome is its own answer: the write may have committed. It
// crosses a hop as a status and is recognised on the other side; with a
// request id, a retry is answered with the first outcome.
func ExampleOutcomeUnknown() {
	err := transport.OutcomeUnknown("10.0.0.3:7000", "connection lost after the request was sent")
	fmt.Println(errors.Is(err, ownership.ErrOutcomeUnknown), errors.Is(err, context.DeadlineExceeded))

	// What a client of a forwarding node receives: the status alone.
	st, _ := status.FromError(err)
	remote := st.Err()
	fmt.Println(status.Code(remote), transport.IsOutcomeUnknown(remote))
	if ou, ok := transport.AsOutcomeUnknown(remote); ok {
		fmt.Println(ou.Addr)
	}

	ctx, _ := transport.WithRequestID(context.Background(), "order-17-payment")
	id, _ := transport.RequestIDFromOutgoing(ctx)
	fmt.Println("retry with the same id:", id)
	// Output:
	// true false
	// Unknown true
	// 10.0.0.3:7000
	// retry with the same id: order-17-payment
}
