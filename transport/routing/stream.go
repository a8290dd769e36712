package routing

import (
	"context"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// NewStream opens a stream to the owner of ctx's key. It implements
// grpc.ClientConnInterface.
//
// An OwnerGuard refuses a stream at its first receive. Until the first
// response message arrives, the stream keeps what it sent (up to
// RouterConfig.StreamReplay messages); when the first receive brings a
// refusal or Unavailable, or the owner leaves the membership, it reopens
// the stream where the refusal points, sends the kept messages again (and
// CloseSend if it was called) and receives from there. A stream's handler
// may have acted on what it received before it failed: make stream
// handlers idempotent, or fence every write. The messages kept must not be
// changed after SendMsg, as grpc.ClientStream requires anyway.
//
// Each attempt runs under a context of its own, derived from ctx, which
// ends when the stream does: like any gRPC stream, receive until an error
// (io.EOF included) or cancel ctx.
func (r *Router) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	rt := new(route)
	ctx, err := r.newRoute(ctx, method, rt)
	if err != nil {
		return nil, err
	}
	// A stream is retried only until its first response, by the replay
	// rules above, whatever it carries.
	rt.idempotent, rt.safe = true, true
	s := &routedStream{
		ctx:        ctx,
		desc:       desc,
		method:     method,
		opts:       opts,
		rt:         rt,
		replayable: r.cfg.StreamReplay > 0,
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// routedStream is a client stream that can move to the next owner until
// its first response arrives.
type routedStream struct {
	ctx    context.Context
	desc   *grpc.StreamDesc
	method string
	opts   []grpc.CallOption

	mu         sync.Mutex // guards the fields below; held while replaying
	rt         *route
	cur        grpc.ClientStream
	att        *attempt // cur's attempt; ended when cur ends
	sent       []any
	closedSend bool
	replayable bool // no response yet, and sent holds every message sent
	ended      bool
}

// open opens a stream at the key's owner, retrying as Invoke does while
// opening fails.
func (s *routedStream) open() error {
	var cs grpc.ClientStream
	a, err := s.rt.do(s.ctx, s.opts, func(a *attempt, cc *grpc.ClientConn) (err error) {
		cs, err = cc.NewStream(a.ctx, s.desc, s.method, a.opts...)
		return err
	})
	if err != nil {
		return err
	}
	s.cur, s.att = cs, a
	return nil
}

func (s *routedStream) stream() grpc.ClientStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *routedStream) Header() (metadata.MD, error) { return s.stream().Header() }
func (s *routedStream) Trailer() metadata.MD         { return s.stream().Trailer() }
func (s *routedStream) Context() context.Context     { return s.stream().Context() }

func (s *routedStream) CloseSend() error {
	s.mu.Lock()
	s.closedSend = true
	cs := s.cur
	s.mu.Unlock()
	return cs.CloseSend()
}

func (s *routedStream) SendMsg(m any) error {
	s.mu.Lock()
	if s.replayable {
		if len(s.sent) < s.rt.r.cfg.StreamReplay {
			s.sent = append(s.sent, m)
		} else {
			s.replayable, s.sent = false, nil
		}
	}
	kept := s.replayable
	cs := s.cur
	s.mu.Unlock()
	err := cs.SendMsg(m)
	if err == io.EOF && kept {
		// The stream has ended, perhaps refused: the message is kept for a
		// replay, and RecvMsg tells what happened.
		return nil
	}
	return err
}

func (s *routedStream) RecvMsg(m any) error {
	cs := s.stream()
	for {
		err := cs.RecvMsg(m)
		if err == nil {
			s.mu.Lock()
			s.replayable, s.sent = false, nil
			s.mu.Unlock()
			if !s.desc.ServerStreams {
				s.end() // a unary response ends the stream
			}
			return nil
		}
		if cs, err = s.reopen(cs, err); err != nil {
			s.end()
			return err
		}
	}
}

// end ends the current attempt, once the stream is over.
func (s *routedStream) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		s.rt.r.end(s.att)
	}
}

// reopen moves the stream to the next owner after failed, the current
// stream, ended with err before any response. It returns the new stream,
// or the error to return from RecvMsg.
func (s *routedStream) reopen(failed grpc.ClientStream, err error) (grpc.ClientStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != failed {
		return s.cur, nil // another RecvMsg moved it already
	}
	if !s.replayable || err == io.EOF {
		return nil, err
	}
	old := s.att
	s.rt.r.end(old)
	if err = s.rt.next(s.ctx, old, old.addr, err); err != nil {
		s.replayable, s.sent, s.ended = false, nil, true
		return nil, err
	}
	if err := s.open(); err != nil {
		s.replayable, s.sent, s.ended = false, nil, true
		return nil, err
	}
	cs := s.cur
	// io.EOF: the new stream ended during the replay; its RecvMsg says why.
	if err := s.replay(cs); err != nil && err != io.EOF {
		return nil, err
	}
	return cs, nil
}

func (s *routedStream) replay(cs grpc.ClientStream) error {
	for _, m := range s.sent {
		if err := cs.SendMsg(m); err != nil {
			return err
		}
	}
	if s.closedSend {
		return cs.CloseSend()
	}
	return nil
}
