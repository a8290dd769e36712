package kvnode

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/transport"
	"github.com/tenure-go/tenure/transport/routing"
)

// A call reaches a node in one of two ways:
//
//   - from a client, without a routing key in its metadata: the node
//     forwards it through its router, which sends it to the key's owner
//     with the key (and the client's request id, if any) attached, follows
//     not-owner answers and waits out handoffs;
//   - from a router, with the key (transport.KeyMetadata): the OwnerGuard
//     lets it through only if this node holds the key's lease and the
//     request names the routed key, and the handler serves it under that
//     lease.
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

// requestKey is the key a KV request names, for the guard to compare with
// the routed one.
func requestKey(req any) ([]byte, bool) {
	if r, ok := req.(interface{ GetKey() string }); ok {
		return []byte(r.GetKey()), true
	}
	return nil, false
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
	id, err := transport.RequestIDFromIncoming(ctx)
	if err != nil {
		return nil, err
	}
	// The guard turns a stale-token error into a handoff status (the
	// router retries at the next owner) and tells the coordinator.
	return s.n.put(ctx, lease, id, req.GetKey(), req.GetValue())
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
// gate (so a release waits for it), in a fenced transaction that commits
// only while the lease's token is the database's mark for the partition,
// with the other writes to the partition queued beside it
// (sqlfence.Batcher).
// A write with a request id that the partition has applied already is
// answered with the first write's response instead (sqlfence.Requests,
// inside the same transaction).
func (n *Node) put(ctx context.Context, lease *ownership.Lease, id, key string, value []byte) (*kvpb.PutResponse, error) {
	if err := n.gate.Enter(lease); err != nil {
		return nil, err // not acquired yet, or being released: the router retries
	}
	defer n.gate.Exit(lease)
	t := lease.Token()
	if n.cfg.WriteHook != nil {
		var done func()
		ctx, done = n.cfg.WriteHook(ctx, t)
		defer done()
	}
	resp := &kvpb.PutResponse{Partition: t.Partition, Epoch: t.Epoch, Owner: t.Owner}
	first, dup, err := n.batch.Do(ctx, t, id, func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
		if err := put(ctx, tx, t, id, key, value); err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	var stale *ownership.StaleTokenError
	switch {
	case errors.As(err, &stale):
		n.stats.staleRejected.Add(1)
		n.log.Warn("write refused by the fence: a newer owner fenced the partition", "token", t.String(), "current", stale.Current.String())
		return nil, err
	case errors.Is(err, ownership.ErrOutcomeUnknown):
		n.log.Warn("write's commit outcome unknown", "token", t.String(), "request_id", id, "err", err)
		return nil, err
	case err != nil:
		return nil, err
	case dup:
		n.stats.duplicates.Add(1)
		resp = new(kvpb.PutResponse)
		if err := proto.Unmarshal(first, resp); err != nil {
			return nil, status.Errorf(codes.Internal, "kvnode: the recorded response of request %q: %v", id, err)
		}
		return resp, nil
	}
	n.stats.putsApplied.Add(1)
	return resp, nil
}

// forward checks a client's key and returns the context that routes the
// call by it, with the client's request id, if it sent one. It counts the
// call as forwarded when another node owns the key, as this node sees it.
func (n *Node) forward(ctx context.Context, key string) (context.Context, error) {
	if key == "" || len(key) > transport.MaxKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "kvnode: the key must be 1 to %d bytes", transport.MaxKeySize)
	}
	id, err := transport.RequestIDFromIncoming(ctx)
	if err != nil {
		return nil, err
	}
	if id != "" {
		if ctx, err = transport.WithRequestID(ctx, id); err != nil {
			return nil, fmt.Errorf("kvnode: %w", err)
		}
	}
	k := []byte(key)
	if o, err := n.c.Owner(k); err == nil && o.Node != n.cfg.Name {
		n.stats.forwarded.Add(1)
	}
	return transport.WithKey(ctx, k), nil
}
