package routing

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

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// Owners tells a Router who owns a key; *coordinator.Coordinator
// implements it. Owner is called on every attempt and by the router's
// follower, concurrently, and must not block.
type Owners interface {
	Owner(key []byte) (ownership.OwnerInfo, error)
}

// Membership is what a Router follows so that no call waits on a member
// that is gone or on a partition that moved; *coordinator.Coordinator
// implements it. Subscribe is called once, by NewRouter; Members by the
// router's follower after membership events. Neither may block.
//
// The router acts on these events: EventMemberJoined, EventMemberLeaving,
// EventMemberLeft and EventLeaving (the membership or the table changed:
// it reads Members and checks every call), EventHolderChanged and
// EventAcquired (a partition's holder changed: it checks that partition's
// calls). The channel may drop events only while it is full (the router
// then checks everything), and is closed when the subscription ends.
// Subscribe may return a nil channel (no events): the follower then checks
// everything every RouterConfig.FollowInterval instead.
type Membership interface {
	Members() []ownership.Member
	Subscribe(buf int) (<-chan coordinator.Event, func())
}

// RouterConfig configures a Router.
type RouterConfig struct {
	// Owners answers who owns a key. Required: usually the local
	// *coordinator.Coordinator of the process making the calls.
	Owners Owners
	// Membership tells the router when members leave (or fail) and when a
	// partition changes hands, so it cancels the attempts in flight to a
	// node that is gone or lost the key's partition, retries them at the new
	// owner if that is safe, and closes the departed members' connections.
	// Required: the same coordinator (or a wrapper of it; the router does
	// not look for it behind Owners). Without it a call forwarded to an
	// owner that freezes waits until its deadline.
	Membership Membership
	// DialOptions apply to every member connection. They must set the
	// transport credentials (transport.ClientTLSConfig, or
	// insecure.NewCredentials() on a trusted network) and should set
	// keepalive (transport.Keepalive.DialOptions). The router first sets a
	// connect backoff capped at 2 s (gRPC's default grows to 2 minutes, too
	// slow for a node that restarts at the same address); a
	// grpc.WithConnectParams here replaces it. A codec must be chosen per
	// call (grpc.CallContentSubtype), not in default call options.
	DialOptions []grpc.DialOption
	// Idempotent reports whether a method (its full name) may run twice
	// with the effect of once: a read, a Put that sets a value no one else
	// writes. Such calls, and calls that carry a request id
	// (transport.WithRequestID), are safe to retry: the router retries them
	// after any failure, an unknown outcome included. Any other call whose
	// request may have reached its owner is not retried when the answer is
	// lost: it fails with a *transport.OutcomeUnknownError. Default nil: no
	// method is idempotent.
	Idempotent func(fullMethod string) bool
	// MaxRedirects is how many not-owner answers a call follows in a row
	// before it pauses and asks Owners again. A hint that leads back to an
	// address already tried in the row also ends it (the loop guard), and
	// so does a hint to an address that is no current member's service
	// address (see the package doc: what a hint is trusted for).
	// Default 3.
	MaxRedirects int
	// MaxAttempts bounds the pauses of one call: after an Unavailable answer
	// (a handoff, an owner that can't be reached, no owner yet) or a row of
	// redirects, the call waits and tries again, at most MaxAttempts times,
	// and never past its context's deadline, which bounds the whole call.
	// Default 60 (about 15 s with the default backoff): more than the
	// coordinator's LocalConfig and LANConfig need to re-own a crashed
	// node's partitions. Give calls a deadline.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the pause before a retry: it doubles
	// from BackoffBase up to BackoffMax, with jitter, and ends early when
	// Membership reports a change. Defaults 10 ms and 250 ms. Shorter
	// pauses fail over sooner and load a recovering cluster more.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// StreamReplay is how many sent messages a stream keeps until its first
	// response arrives, so it can be replayed at the next owner if the first
	// one refuses it. A stream that sends more before any response is not
	// retried. Default 64; negative turns stream retries off.
	StreamReplay int
	// FollowInterval is how often the router checks the attempts in flight
	// and the pauses against Membership and Owners when Membership gives no
	// events (Subscribe returns a nil channel). With events it is not used:
	// the router checks on each event only. Default 100 ms.
	FollowInterval time.Duration
	// MoveGrace is how long an attempt in flight at a member that is still
	// in the membership but no longer holds the key's partition (another
	// node has claimed it) may still answer before it is cancelled: a
	// handoff's last answers are on their way. Default 250 ms.
	MoveGrace time.Duration
}

// Validate reports the first problem with c. It does not change c.
func (c RouterConfig) Validate() error {
	switch {
	case c.Owners == nil:
		return errors.New("routing: RouterConfig.Owners is nil")
	case c.Membership == nil:
		return errors.New("routing: RouterConfig.Membership is nil (set it to the coordinator)")
	case c.MaxRedirects < 0 || c.MaxAttempts < 0:
		return errors.New("routing: RouterConfig.MaxRedirects and MaxAttempts must not be negative")
	case c.BackoffBase < 0 || c.BackoffMax < 0 || c.FollowInterval < 0 || c.MoveGrace < 0:
		return errors.New("routing: RouterConfig durations must not be negative")
	case c.BackoffMax != 0 && c.BackoffBase > c.BackoffMax:
		return errors.New("routing: RouterConfig.BackoffBase is above BackoffMax")
	}
	return nil
}

func (c RouterConfig) withDefaults() RouterConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.MaxRedirects == 0 {
		c.MaxRedirects = 3
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 60
	}
	def(&c.BackoffBase, 10*time.Millisecond)
	def(&c.BackoffMax, max(250*time.Millisecond, c.BackoffBase))
	def(&c.FollowInterval, 100*time.Millisecond)
	def(&c.MoveGrace, 250*time.Millisecond)
	if c.StreamReplay == 0 {
		c.StreamReplay = 64
	}
	return c
}

// A Router sends each call to the owner of the call's key (set with
// transport.WithKey), over one connection per member address. It
// implements grpc.ClientConnInterface: pass it to any generated client
// constructor.
//
// Routing never moves a key to another node because its owner can't be
// reached: the call waits and retries the owner the coordinator names until
// the cluster re-owns the partition, MaxAttempts is used up, or the
// context ends. A not-owner answer (another node's view is newer) is
// followed at once, within MaxRedirects and the loop guard, and only to a
// current member's service address: the router dials no address but its
// members'.
//
// Attempts follow the membership: when the owner an attempt was sent to
// leaves the membership (or fails), or another node claims the key's
// partition, the attempt is cancelled at once (after MoveGrace for a
// claim). What happens next depends on whether the request may have reached
// the owner:
//
//   - not sent yet (no connection, a refusal before the handler ran: not
//     owner, handoff): the call is retried at the new owner;
//   - sent, and the call is safe to retry (RouterConfig.Idempotent, or a
//     request id): retried too;
//   - sent, and not safe to retry: the call fails at once with a
//     *transport.OutcomeUnknownError (errors.Is ownership.ErrOutcomeUnknown;
//     code Unknown with a ReasonOutcomeUnknown detail). So do a call whose
//     connection broke after it was sent, a call whose owner answered that
//     its commit's outcome is unknown, and a call whose deadline passed
//     while it was in flight. It is never retried on its own.
//
// Don't pass grpc.WaitForReady(true) to routed calls: the call would wait on
// one member's connection and miss the partition moving elsewhere. The
// router does the waiting itself.
//
// A Router is safe for concurrent use. Close it when done.
type Router struct {
	cfg  RouterConfig
	dial []grpc.DialOption

	conns atomic.Pointer[map[string]*grpc.ClientConn] // replaced, never mutated
	mu    sync.Mutex                                  // serialises conns writers; guards shut
	shut  bool

	inflightMu sync.Mutex
	inflight   map[*attempt]struct{}
	waiting    map[*waiter]struct{} // calls pausing before a retry
	gen        atomic.Uint64        // the follower's checks; incremented with inflightMu held

	live     map[string]string                    // member service address -> name, as last seen; the follower's
	departed atomic.Pointer[map[string]time.Time] // addresses of members that left, and when; replaced under mu

	unsubscribe func()
	poke        chan struct{} // a MoveGrace to time, found outside the follower
	quit        chan struct{}
	wg          sync.WaitGroup

	redirects, retries, cancelled, unknown atomic.Uint64
}

var _ grpc.ClientConnInterface = (*Router)(nil)

// NewRouter returns a router for cfg and starts its follower, which
// subscribes to cfg.Membership. It dials nothing until a call needs a
// member.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &Router{
		cfg:      cfg,
		inflight: map[*attempt]struct{}{},
		waiting:  map[*waiter]struct{}{},
		live:     map[string]string{},
		poke:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	r.dial = append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: 2 * time.Second,
	})}, cfg.DialOptions...)
	r.conns.Store(&map[string]*grpc.ClientConn{})
	r.departed.Store(&map[string]time.Time{})
	r.refreshMembers()
	events, unsubscribe := cfg.Membership.Subscribe(followBuffer)
	r.unsubscribe = unsubscribe
	r.wg.Add(1)
	go r.follow(events)
	return r, nil
}

// followBuffer is the room for events in the follower's subscription.
const followBuffer = 256

// RouterStats counts what a router did beyond sending calls.
type RouterStats struct {
	Redirects uint64 // not-owner answers followed, or refused (a loop, too many, not a member's address)
	Retries   uint64 // pauses before trying again
	Cancelled uint64 // attempts cancelled because their owner left or lost the partition
	Unknown   uint64 // calls that ended with an unknown outcome
}

// Stats returns the router's counters since NewRouter.
func (r *Router) Stats() RouterStats {
	return RouterStats{
		Redirects: r.redirects.Load(), Retries: r.retries.Load(),
		Cancelled: r.cancelled.Load(), Unknown: r.unknown.Load(),
	}
}

// Close stops the follower and closes every member connection; calls in
// flight fail with Canceled. Calls after Close fail too. It is idempotent.
func (r *Router) Close() error {
	r.mu.Lock()
	if r.shut {
		r.mu.Unlock()
		return nil
	}
	r.shut = true
	close(r.quit)
	r.mu.Unlock()
	r.unsubscribe()
	r.wg.Wait()
	var errs []error
	for _, cc := range *r.conns.Swap(&map[string]*grpc.ClientConn{}) {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

var errRouterClosed = status.Error(codes.Canceled, "tenure: router closed")

// closed reports whether Close has been called.
func (r *Router) closed() bool {
	select {
	case <-r.quit:
		return true
	default:
		return false
	}
}

// Conn returns the router's connection to the member serving at addr
// (host:port), dialing it if needed. Calls made on it are not routed. It
// fails with Unavailable for the address of a member that left the
// membership (until a member serves there again).
func (r *Router) Conn(addr string) (*grpc.ClientConn, error) {
	if cc, ok := (*r.conns.Load())[addr]; ok {
		return cc, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return nil, errRouterClosed
	}
	if _, ok := (*r.departed.Load())[addr]; ok {
		return nil, status.Errorf(codes.Unavailable, "tenure: the member at %s left the membership", addr)
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
		return nil, status.Errorf(codes.Internal, "tenure: dial %s: %v", addr, err)
	}
	next := make(map[string]*grpc.ClientConn, len(old)+1)
	for a, c := range old {
		next[a] = c
	}
	next[addr] = cc
	r.conns.Store(&next)
	return cc, nil
}

// Invoke sends a unary call to the owner of ctx's key. It implements
// grpc.ClientConnInterface.
func (r *Router) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	var rt route
	ctx, err := r.newRoute(ctx, method, &rt)
	if err != nil {
		return err
	}
	a, err := rt.do(ctx, opts, func(a *attempt, cc *grpc.ClientConn) error {
		return cc.Invoke(a.ctx, method, args, reply, a.opts...)
	})
	if a != nil {
		r.end(a)
	}
	return err
}

// newRoute checks ctx's key and request id, sets up rt for the call, and
// returns the context that carries the key.
func (r *Router) newRoute(ctx context.Context, method string, rt *route) (context.Context, error) {
	key, ok := transport.KeyFrom(ctx)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "tenure: the call's context has no routing key (use transport.WithKey)")
	}
	if err := transport.CheckKey(key); err != nil {
		return nil, err
	}
	id, err := transport.RequestIDFromOutgoing(ctx)
	if err != nil {
		return nil, err
	}
	idem := r.cfg.Idempotent != nil && r.cfg.Idempotent(method)
	*rt = route{r: r, key: key, idempotent: idem, safe: idem || id != ""}
	return metadata.AppendToOutgoingContext(ctx, transport.KeyMetadata, string(key)), nil
}

// route is the routing state of one call: where the last answer pointed
// and how many redirects and pauses the call has used.
type route struct {
	r          *Router
	key        []byte
	idempotent bool     // the method may run twice
	safe       bool     // idempotent, or the call carries a request id
	hint       string   // address a not-owner answer pointed to, if any
	hintNode   string   // the node it named
	visited    []string // addresses tried in the current row of redirects
	redirects  int      // in the current row
	pauses     int      // in all, against MaxAttempts
	step       int      // the backoff's: pauses since the view last changed

	partition uint32    // key's, once located
	located   bool      // Owners has answered once
	seen      ownerView // what Owners said when the last target was chosen
	gen       uint64    // the follower's checks then (see begin)
}

// do makes call on the connection to the key's owner, each time as a new
// attempt registered with the follower, following not-owner answers and
// pausing as next decides, until call succeeds or next gives up. It
// returns the successful attempt, still registered: the caller ends it.
func (rt *route) do(ctx context.Context, opts []grpc.CallOption, call func(*attempt, *grpc.ClientConn) error) (*attempt, error) {
	for {
		var a *attempt
		addr, node, err := rt.target()
		if err == nil {
			var cc *grpc.ClientConn
			if cc, err = rt.r.Conn(addr); err == nil {
				a = rt.r.begin(ctx, rt, addr, node, opts)
				if err = call(a, cc); err == nil {
					return a, nil
				}
				rt.r.end(a)
			}
		}
		if err = rt.next(ctx, a, addr, err); err != nil {
			if transport.IsOutcomeUnknown(err) {
				rt.r.unknown.Add(1)
			}
			return nil, err
		}
	}
}

// target returns the address to try next, and the node expected there:
// the last hint, else the owner Owners names.
func (rt *route) target() (addr, node string, err error) {
	rt.gen = rt.r.gen.Load() // before Owners: see begin
	if rt.hint != "" {
		return rt.hint, rt.hintNode, nil
	}
	o, err := rt.r.cfg.Owners.Owner(rt.key)
	if err != nil {
		rt.seen = ownerView{}
		return "", "", status.Errorf(codes.Unavailable, "tenure: no owner for the key: %v", err)
	}
	rt.partition, rt.located = o.Partition, true
	rt.seen = ownerView{node: o.Node, token: o.Token}
	if o.Addr == "" {
		return "", "", status.Errorf(codes.Unavailable, "tenure: owner %s of partition %d has no service address", o.Node, o.Partition)
	}
	return o.Addr, o.Node, nil
}

// next judges the failed attempt a at addr (nil if none was made): it
// returns nil when the call should try again (after a pause if needed), or
// the error to return.
func (rt *route) next(ctx context.Context, a *attempt, addr string, err error) error {
	sent := a != nil && a.sent.Load()
	if rt.r.closed() {
		if sent && !rt.safe {
			return transport.OutcomeUnknown(addr, "the router was closed while the call was in flight")
		}
		return errRouterClosed
	}
	cerr := ctx.Err()
	if cerr == nil && status.Code(err) == codes.DeadlineExceeded {
		// The server saw the call's deadline pass (grpc-timeout) a moment
		// before the caller's context did.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		if sent && !rt.idempotent {
			return transport.OutcomeUnknown(addr, fmt.Sprintf("%v while the call was in flight (last answer: %v)", cerr, status.Convert(err).Message()))
		}
		if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
			return err
		}
		return status.FromContextError(fmt.Errorf("%w (last answer: %v)", cerr, err)).Err()
	}
	if a != nil {
		var gone *ownerGoneError
		if errors.As(context.Cause(a.ctx), &gone) {
			if sent && !rt.safe {
				return transport.OutcomeUnknown(addr, gone.Error())
			}
			return rt.pause(ctx, gone)
		}
	}
	if h, ok := transport.OwnerHint(err); ok {
		rt.r.redirects.Add(1)
		if rt.redirects < rt.r.cfg.MaxRedirects && h.Addr != "" && h.Addr != addr && !slices.Contains(rt.visited, h.Addr) {
			if node, ok := rt.r.memberAt(h.Addr); ok {
				rt.redirects++
				rt.visited = append(rt.visited, addr)
				rt.hint, rt.hintNode = h.Addr, node
				return nil
			}
		}
		// A loop, a hint without an address or to an address no member
		// serves at, or too many in a row: the views disagree; let them
		// converge.
		return rt.pause(ctx, err)
	}
	if transport.IsHandoff(err) {
		return rt.pause(ctx, err) // refused before the handler ran
	}
	if ou, ok := transport.AsOutcomeUnknown(err); ok {
		if rt.safe {
			return rt.pause(ctx, err)
		}
		if ou.Addr == "" {
			ou = &transport.OutcomeUnknownError{Addr: addr, Reason: ou.Reason}
		}
		return ou
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		// Canceled without the caller's context ending: the router closed
		// the connection of a member that left.
		if sent && !rt.safe {
			return transport.OutcomeUnknown(addr, status.Convert(err).Message())
		}
		return rt.pause(ctx, err)
	}
	return err
}

// memberAt returns the name of the current member whose service address
// is addr, as Membership says: a not-owner hint is followed only to such
// an address (see Router), and the node expected there is the member's
// name, not the hint's.
func (r *Router) memberAt(addr string) (string, bool) {
	for _, m := range r.cfg.Membership.Members() {
		if m.ServiceAddr == addr {
			return m.Name, true
		}
	}
	return "", false
}

// pause waits before the next attempt, which starts again from Owners.
// The follower ends the wait early when the key's partition gets a new
// holder or the owner Owners names changes; so does a change seen since
// the last attempt's target was chosen. After such a change the backoff
// starts again from BackoffBase.
func (rt *route) pause(ctx context.Context, err error) error {
	rt.hint, rt.hintNode, rt.visited, rt.redirects = "", "", rt.visited[:0], 0
	if rt.pauses >= rt.r.cfg.MaxAttempts {
		return status.Convert(err).Err()
	}
	rt.pauses++
	rt.r.retries.Add(1)
	w := rt.r.wait(rt)
	defer rt.r.unwait(w)
	if w.seen != rt.seen {
		rt.step = 0
		return nil
	}
	t := time.NewTimer(rt.r.backoff(rt.step + 1))
	defer t.Stop()
	select {
	case <-t.C:
		rt.step++
		return nil
	case <-w.wake:
		rt.step = 0
		return nil
	case <-ctx.Done():
		return status.FromContextError(fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)).Err()
	}
}

// A waiter is a call pausing before a retry, which the follower wakes.
type waiter struct {
	key       []byte
	partition uint32
	located   bool
	seen      ownerView     // what Owners said once the waiter was registered; under inflightMu
	wake      chan struct{} // closed by the follower
	woke      bool          // the follower's
}

// wait registers rt's call as pausing, then reads what Owners says of its
// key: a change the follower handles after this wakes the waiter.
func (r *Router) wait(rt *route) *waiter {
	w := &waiter{key: rt.key, partition: rt.partition, located: rt.located, wake: make(chan struct{})}
	r.inflightMu.Lock()
	r.waiting[w] = struct{}{}
	r.inflightMu.Unlock()
	seen := r.view(rt.key)
	r.inflightMu.Lock()
	w.seen = seen
	r.inflightMu.Unlock()
	return w
}

func (r *Router) unwait(w *waiter) {
	r.inflightMu.Lock()
	delete(r.waiting, w)
	r.inflightMu.Unlock()
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
