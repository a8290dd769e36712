package routing

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// An attempt is one try of a call at one member: its own context, which the
// follower cancels when the member leaves or loses the key's partition, and
// whether its request was handed to the connection (sent), which decides
// whether a failure may hide an applied call.
//
// The attempt is the call's codec (encoding.CodecV2) around the one the
// call would use: grpc marshals the request only once it has a stream on a
// connection to the member, so a Marshal means the request may have been
// delivered.
type attempt struct {
	ctx       context.Context
	cancel    context.CancelCauseFunc
	opts      []grpc.CallOption
	addr      string
	node      string // the node expected at addr; "" if unknown
	key       []byte
	partition uint32 // key's
	sent      atomic.Bool
	inner     encoding.CodecV2 // nil: grpc picks the codec, and the call counts as sent

	movedAt atomic.Int64 // when the follower first saw another holder (Unix ns); 0: none
}

// begin registers a new attempt of rt's call at addr with the follower.
// If the follower checked the calls in flight since rt chose addr (rt.gen),
// the attempt is checked against the view that check saw.
func (r *Router) begin(ctx context.Context, rt *route, addr, node string, opts []grpc.CallOption) *attempt {
	a := &attempt{addr: addr, node: node, key: rt.key, partition: rt.partition}
	a.ctx, a.cancel = context.WithCancelCause(ctx)
	if a.inner = callCodec(opts); a.inner == nil {
		a.sent.Store(true) // can't tell: assume the worst
		a.opts = opts
	} else {
		a.opts = append(opts[:len(opts):len(opts)], grpc.ForceCodecV2(a))
	}
	r.inflightMu.Lock()
	r.inflight[a] = struct{}{}
	checked := r.gen.Load() != rt.gen
	r.inflightMu.Unlock()
	if checked {
		r.recheck(a)
	}
	return a
}

// end unregisters a and releases its context.
func (r *Router) end(a *attempt) {
	r.inflightMu.Lock()
	delete(r.inflight, a)
	r.inflightMu.Unlock()
	a.cancel(nil)
}

// callCodec returns the codec a call with opts uses, or nil when opts
// choose it in a way the router does not follow (a grpc.ForceCodec of the
// older interface).
func callCodec(opts []grpc.CallOption) encoding.CodecV2 {
	name := "proto"
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.ForceCodecV2CallOption:
			return o.CodecV2
		case grpc.ContentSubtypeCallOption:
			name = o.ContentSubtype
		case grpc.ForceCodecCallOption, grpc.CustomCodecCallOption:
			return nil
		}
	}
	return encoding.GetCodecV2(name)
}

// Marshal implements encoding.CodecV2: the request is on its way.
func (a *attempt) Marshal(v any) (mem.BufferSlice, error) {
	a.sent.Store(true)
	return a.inner.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (a *attempt) Unmarshal(data mem.BufferSlice, v any) error { return a.inner.Unmarshal(data, v) }

// Name implements encoding.CodecV2.
func (a *attempt) Name() string { return a.inner.Name() }

// ownerGoneError is the cause with which the follower cancels an attempt.
type ownerGoneError struct {
	addr, node string
	why        string // "left the membership", "lost the partition to ..."
}

func (e *ownerGoneError) Error() string {
	who := e.node
	if who == "" {
		who = "the owner"
	}
	return "tenure: " + who + " at " + e.addr + " " + e.why + " while the call was in flight"
}
