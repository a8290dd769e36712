package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

// Owners tells a Router who owns a key; *coordinator.Coordinator
// implements it. Owner is called on every call, concurrently, and must not
// block.
type Owners interface {
	Owner(key []byte) (ownership.OwnerInfo, error)
}

// memberLister is the optional part of Owners a Router uses to close the
// connections of members that are gone.
type memberLister interface {
	Members() []ownership.Member
}

// RouterConfig configures a Router.
type RouterConfig struct {
	// Owners answers who owns a key. Required: usually the local
	// *coordinator.Coordinator of the process making the calls.
	Owners Owners
	// DialOptions apply to every member connection. They must set the
	// transport credentials (ClientTLS, or insecure.NewCredentials() on a
	// trusted network) and should set keepalive (Keepalive.DialOptions).
	// The router first sets a connect backoff capped at 2 s (gRPC's default
	// grows to 2 minutes, too slow for a node that restarts at the same
	// address); a grpc.WithConnectParams here replaces it.
	DialOptions []grpc.DialOption
	// MaxRedirects is how many not-owner answers a call follows in a row
	// before it pauses and asks Owners again. A hint that leads back to an
	// address already tried in the row also ends it (the loop guard).
	// Default 3.
	MaxRedirects int
	// MaxAttempts bounds the pauses of one call: after an Unavailable answer
	// (a handoff, an owner that can't be reached, no owner yet) or a row of
	// redirects, the call waits and tries again, at most MaxAttempts times,
	// and never past its context's deadline. Default 40 (about 15 s with the
	// default backoff): more than the coordinator's LocalConfig and LANConfig
	// need to re-own a crashed node's partitions. Give calls a deadline.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the pause before a retry: it doubles
	// from BackoffBase up to BackoffMax, with jitter. Defaults 10 ms and
	// 500 ms. Shorter pauses fail over sooner and load a recovering
	// cluster more.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// StreamReplay is how many sent messages a stream keeps until its first
	// response arrives, so it can be replayed at the next owner if the first
	// one refuses it. A stream that sends more before any response is not
	// retried. Default 64; negative turns stream retries off.
	StreamReplay int
}

// Validate reports the first problem with c. It does not change c.
func (c RouterConfig) Validate() error {
	switch {
	case c.Owners == nil:
		return errors.New("transport: RouterConfig.Owners is nil")
	case c.MaxRedirects < 0 || c.MaxAttempts < 0:
		return errors.New("transport: RouterConfig.MaxRedirects and MaxAttempts must not be negative")
	case c.BackoffBase < 0 || c.BackoffMax < 0:
		return errors.New("transport: RouterConfig backoffs must not be negative")
	case c.BackoffMax != 0 && c.BackoffBase > c.BackoffMax:
		return errors.New("transport: RouterConfig.BackoffBase is above BackoffMax")
	}
	return nil
}

func (c RouterConfig) withDefaults() RouterConfig {
	if c.MaxRedirects == 0 {
		c.MaxRedirects = 3
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 40
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = 10 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(500*time.Millisecond, c.BackoffBase)
	}
	if c.StreamReplay == 0 {
		c.StreamReplay = 64
	}
	return c
}

// A Router sends each call to the owner of the call's key (set with
// WithKey), over one connection per member address. It implements
// grpc.ClientConnInterface: pass it to any generated client constructor.
//
// Routing never moves a key to another node because its owner can't be
// reached: the call waits and retries the owner the coordinator names until
// the cluster re-owns the partition, MaxAttempts is used up, or the
// context ends. A not-owner answer (another node's view is newer) is
// followed at once, within MaxRedirects and the loop guard.
//
// A call is retried only before any response message has arrived. The
// refusals of an OwnerGuard come before the handler runs, but a call whose
// connection broke may have run in part on the old owner: make handlers
// idempotent or fence every write (the token rejects the stale ones).
//
// Don't pass grpc.WaitForReady(true) to routed calls: the call would wait on
// one member's connection and miss the partition moving elsewhere. The
// router does the waiting itself.
//
// A Router is safe for concurrent use. Close it when done.
type Router struct {
	cfg     RouterConfig
	members memberLister
	dial    []grpc.DialOption

	conns atomic.Pointer[map[string]*grpc.ClientConn] // replaced, never mutated
	mu    sync.Mutex                                  // serialises conns writers
	shut  bool

	redirects atomic.Uint64
	retries   atomic.Uint64
}

var _ grpc.ClientConnInterface = (*Router)(nil)

// NewRouter returns a router for cfg. It dials nothing until a call needs
// a member.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Router{cfg: cfg}
	r.members, _ = cfg.Owners.(memberLister)
	r.dial = append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: 2 * time.Second,
	})}, cfg.DialOptions...)
	r.conns.Store(&map[string]*grpc.ClientConn{})
	return r, nil
}

// RouterStats counts what a router did beyond sending calls.
type RouterStats struct {
	Redirects uint64 // not-owner answers followed or refused by the loop guard
	Retries   uint64 // pauses before trying again
}

// Stats returns the router's counters since NewRouter.
func (r *Router) Stats() RouterStats {
	return RouterStats{Redirects: r.redirects.Load(), Retries: r.retries.Load()}
}

// Close closes every member connection; calls in flight fail with
// Canceled. Calls after Close fail too. It is idempotent.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return nil
	}
	r.shut = true
	var errs []error
	for _, cc := range *r.conns.Swap(&map[string]*grpc.ClientConn{}) {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

var errRouterClosed = status.Error(codes.Canceled, "transport: router closed")

// Conn returns the router's connection to the member serving at addr
// (host:port), dialing it if needed. Calls made on it are not routed.
func (r *Router) Conn(addr string) (*grpc.ClientConn, error) {
	if cc, ok := (*r.conns.Load())[addr]; ok {
		return cc, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return nil, errRouterClosed
	}
	old := *r.conns.Load()
	if cc, ok := old[addr]; ok {
		return cc, nil
	}
	target := addr
	if !strings.Contains(addr, "://") {
		target = "passthrough:///" + addr
	}
	cc, err := grpc.NewClient(target, r.dial...)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "transport: dial %s: %v", addr, err)
	}
	next := make(map[string]*grpc.ClientConn, len(old)+1)
	next[addr] = cc
	var gone []*grpc.ClientConn
	live := r.liveAddrs()
	for a, c := range old {
		if live == nil || live[a] {
			next[a] = c
		} else {
			gone = append(gone, c)
		}
	}
	r.conns.Store(&next)
	for _, c := range gone {
		_ = c.Close()
	}
	return cc, nil
}

// liveAddrs returns the service addresses of the current members, or nil
// when Owners can't tell.
func (r *Router) liveAddrs() map[string]bool {
	if r.members == nil {
		return nil
	}
	ms := r.members.Members()
	if len(ms) == 0 {
		return nil
	}
	live := make(map[string]bool, len(ms))
	for _, m := range ms {
		live[m.ServiceAddr] = true
	}
	return live
}

// Invoke sends a unary call to the owner of ctx's key. It implements
// grpc.ClientConnInterface.
func (r *Router) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	key, err := callKey(ctx)
	if err != nil {
		return err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, KeyMetadata, string(key))
	rt := route{r: r, key: key}
	_, err = rt.do(ctx, func(cc *grpc.ClientConn) error {
		return cc.Invoke(ctx, method, args, reply, opts...)
	})
	return err
}

// route is the routing state of one call: where the last answer pointed
// and how many redirects and pauses the call has used.
type route struct {
	r         *Router
	key       []byte
	hint      string   // address a not-owner answer pointed to, if any
	visited   []string // addresses tried in the current row of redirects
	redirects int      // in the current row
	pauses    int
}

// do makes call on the connection to the key's owner, following
// not-owner answers and pausing as next decides, until call succeeds or
// next gives up. It returns the address call succeeded at.
func (rt *route) do(ctx context.Context, call func(*grpc.ClientConn) error) (string, error) {
	for {
		addr, err := rt.target()
		if err == nil {
			var cc *grpc.ClientConn
			if cc, err = rt.r.Conn(addr); err == nil {
				if err = call(cc); err == nil {
					return addr, nil
				}
			}
		}
		if err = rt.next(ctx, addr, err); err != nil {
			return "", err
		}
	}
}

// target returns the address to try next: the last hint, else the owner
// Owners names.
func (rt *route) target() (string, error) {
	if rt.hint != "" {
		return rt.hint, nil
	}
	o, err := rt.r.cfg.Owners.Owner(rt.key)
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "transport: no owner for the key: %v", err)
	}
	if o.Addr == "" {
		return "", status.Errorf(codes.Unavailable, "transport: owner %s of partition %d has no service address", o.Node, o.Partition)
	}
	return o.Addr, nil
}

// next judges the failed attempt at addr: it returns nil when the call
// should try again (after a pause if needed), or the error to return.
func (rt *route) next(ctx context.Context, addr string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
			return err
		}
		return status.FromContextError(fmt.Errorf("%w (last answer: %v)", cerr, err)).Err()
	}
	if h, ok := OwnerHint(err); ok {
		rt.r.redirects.Add(1)
		if rt.redirects < rt.r.cfg.MaxRedirects && h.Addr != "" && h.Addr != addr && !slices.Contains(rt.visited, h.Addr) {
			rt.redirects++
			rt.visited = append(rt.visited, addr)
			rt.hint = h.Addr
			return nil
		}
		// A loop, a hint without an address, or too many in a row: the
		// views disagree; let them converge.
		return rt.pause(ctx, err)
	}
	if retryable(ctx, err) {
		return rt.pause(ctx, err)
	}
	return err
}

// retryable reports whether err is worth a pause and a new attempt: a
// handoff, an owner that can't be reached, or a connection the router
// closed because its member left.
func retryable(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		return ctx.Err() == nil
	}
	return false
}

// pause waits before the next attempt, which starts again from Owners.
func (rt *route) pause(ctx context.Context, err error) error {
	rt.hint, rt.visited, rt.redirects = "", rt.visited[:0], 0
	if rt.pauses >= rt.r.cfg.MaxAttempts {
		return err
	}
	rt.pauses++
	rt.r.retries.Add(1)
	t := time.NewTimer(rt.r.backoff(rt.pauses))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)).Err()
	}
}

// backoff returns the pause before attempt n (n >= 1): exponential, capped,
// with jitter in [d/2, d].
func (r *Router) backoff(n int) time.Duration {
	d := r.cfg.BackoffMax
	if n < 32 {
		d = min(r.cfg.BackoffBase<<(n-1), r.cfg.BackoffMax)
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
