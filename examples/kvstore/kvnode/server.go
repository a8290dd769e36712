package kvnode

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/routing"
)

// A call reaches a node in one of two ways:
//
//   - from a client, without a routing key in its metadata: the node
//     forwards it through its router, which sends it to the key's owner
//     with the key attached (and follows not-owner answers, and waits out
//     handoffs);
//   - from a router, with the key (transport.KeyMetadata): the OwnerGuard
//     lets it through only if this node holds the key's lease, and the
//     handler serves it under that lease.
//
// A call that carries a key is never forwarded again, so a call makes at
// most one hop plus the redirects the router follows, within its loop
// guard. Even a call for a key this node owns goes through the router (a
// loopback hop): one code path, the guard, decides ownership.

// intercept sends routed calls through the OwnerGuard and lets clients'
// calls through to the handlers, which forward them.
func (n *Node) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if len(metadata.ValueFromIncomingContext(ctx, transport.KeyMetadata)) == 0 {
		return handler(ctx, req)
	}
	return n.guard(ctx, req, info, handler)
}

// kvServer implements kvpb.KVServer.
type kvServer struct {
	kvpb.UnimplementedKVServer
	n *Node
}

// Put forwards a client's write to the key's owner, or applies a routed
// one under this node's lease.
func (s kvServer) Put(ctx context.Context, req *kvpb.PutRequest) (*kvpb.PutResponse, error) {
	lease, routed := routing.LeaseFrom(ctx)
	if !routed {
		fctx, err := s.n.forward(ctx, req.GetKey())
		if err != nil {
			return nil, err
		}
		return s.n.client.Put(fctx, req)
	}
	if err := checkRoutedKey(ctx, req.GetKey()); err != nil {
		return nil, err
	}
	if err := s.n.put(ctx, lease, req.GetKey(), req.GetValue()); err != nil {
		// The guard turns a stale-token error into a handoff status (the
		// router retries at the next owner) and tells the coordinator.
		return nil, err
	}
	t := lease.Token()
	return &kvpb.PutResponse{Partition: t.Partition, Epoch: t.Epoch, Owner: t.Owner}, nil
}

// Get forwards a client's read to the key's owner, or serves a routed one.
func (s kvServer) Get(ctx context.Context, req *kvpb.GetRequest) (*kvpb.GetResponse, error) {
	lease, routed := routing.LeaseFrom(ctx)
	if !routed {
		fctx, err := s.n.forward(ctx, req.GetKey())
		if err != nil {
			return nil, err
		}
		return s.n.client.Get(fctx, req)
	}
	if err := checkRoutedKey(ctx, req.GetKey()); err != nil {
		return nil, err
	}
	// Every node writes to the one shared database, so a plain read sees
	// every committed write: reads need no fence. They go to the owner
	// anyway, as they would if the owner kept the partition in memory.
	value, found, err := getValue(ctx, s.n.db, req.GetKey())
	if err != nil {
		return nil, err
	}
	s.n.stats.gets.Add(1)
	t := lease.Token()
	return &kvpb.GetResponse{Value: value, Found: found, Partition: t.Partition, Owner: t.Owner}, nil
}

// put applies one write as the partition's owner: through the partition's
// gate (so a release waits for it), in one fenced transaction that commits
// only while the lease's token is the database's mark for the partition.
func (n *Node) put(ctx context.Context, lease *ownership.Lease, key string, value []byte) error {
	g := &n.gates[lease.Partition()]
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.token.Same(lease.Token()) {
		// Not acquired yet, or being released: the router retries.
		return fmt.Errorf("kvnode: partition %d is not open here: %w", lease.Partition(), ownership.ErrLeaseEnded)
	}
	t := lease.Token()
	if n.holds != nil { // fault control: a write paused at the worst moment
		var cancel context.CancelFunc
		ctx, cancel = n.holds.wait(ctx, t.Partition)
		defer cancel()
	}
	err := n.fence.Do(ctx, t, ownership.Exact, func(tx *sql.Tx) error {
		return put(ctx, tx, t, key, value)
	})
	var stale *ownership.StaleTokenError
	switch {
	case errors.As(err, &stale):
		n.stats.staleRejected.Add(1)
		n.log.Warn("write refused by the fence: a newer owner fenced the partition", "token", t, "current", stale.Current)
	case err == nil:
		n.stats.putsApplied.Add(1)
	}
	return err
}

// checkRoutedKey makes sure a routed call's request names the key it was
// routed by (and so the lease the guard checked). The guard has checked
// that the call carries one valid key.
func checkRoutedKey(ctx context.Context, key string) error {
	if routedBy := metadata.ValueFromIncomingContext(ctx, transport.KeyMetadata); len(routedBy) != 1 || routedBy[0] != key {
		return status.Error(codes.InvalidArgument, "kvnode: the request's key differs from the call's routing key")
	}
	return nil
}

// forward checks a client's key and returns the context that routes the
// call by it. It counts the call as forwarded when another node owns the
// key, as this node sees it.
func (n *Node) forward(ctx context.Context, key string) (context.Context, error) {
	if key == "" || len(key) > transport.MaxKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "kvnode: the key must be 1 to %d bytes", transport.MaxKeySize)
	}
	k := []byte(key)
	if o, err := n.c.Owner(k); err == nil && o.Node != n.cfg.Name {
		n.stats.forwarded.Add(1)
	}
	return transport.WithKey(ctx, k), nil
}
