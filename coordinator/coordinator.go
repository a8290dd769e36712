package coordinator

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ownership/quorum"
	"github.com/tenure-go/tenure/ring"
)

// Sentinel errors of the coordinator. Test for them with errors.Is.
var (
	// ErrNotStarted: the call needs Start first.
	ErrNotStarted = errors.New("coordinator: not started")
	// ErrClosed: the coordinator was closed (or has left, or its Start
	// failed).
	ErrClosed = errors.New("coordinator: closed")
	// ErrStarted: Start was called again. A coordinator starts once.
	ErrStarted = errors.New("coordinator: already started")
)

// Coordinator is one node's embedded ownership coordinator. Its methods
// are safe for concurrent use.
type Coordinator struct {
	cfg  Config
	self ownership.Node
	log  *slog.Logger

	reg    *gossip.Register // the machine's record of claims (MachineConfig.Register), gossiped
	auth   ownership.Authority
	view   atomic.Pointer[view]
	leases *registry // written by the loop only; Lease reads its served slots
	stable atomic.Pointer[quorum.Stable]

	pushMu     sync.Mutex // serializes memberlist's UpdateNode
	metaMu     sync.Mutex
	metaVal    meta
	meta       atomic.Pointer[[]byte]
	quorumOK   atomic.Bool
	quorumNote atomic.Pointer[quorumNote] // the quorum and why there is none, as the loop last saw them (Status)
	lag        atomic.Int64               // the loop's lag (a time.Duration), for Status

	ml         *memberlist.Memberlist // set by Start, under lifeMu, before started
	mlp        atomic.Pointer[memberlist.Memberlist]
	gossipAddr atomic.Pointer[string] // set by Start
	mlKeys     *memberlist.Keyring
	bq         *broadcastQueue
	dlg        *delegate // set by Start, before memberlist starts

	inbox    inbox
	exch     chan exchangeJob // cap exchangeQueue: the digest exchange's sends
	stableCh chan string      // cap exchangeQueue: members whose stable asks wait for an answer (answerStable)
	acks     acks             // members memberlist's probes heard from, for the reach check to vouch for
	nodes    nodeSet
	memberCh chan struct{} // cap 1: membership changed
	inputs   chan input
	leaveCh  chan struct{}
	idleCh   chan struct{} // closed by the loop when idle after Leave

	opener        gossip.Opener // opens the gossip this node receives
	askWindow     time.Duration // how long a member's differing digest makes its asks due (exchange.go)
	unverifiedLog logLimit      // bounds the log lines of claims that did not verify

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// lifeMu orders Start and Close: state moves new -> starting ->
	// running -> closed, or to closed from any state. Close waits for a
	// Start in flight (startDone) after it has aborted its join.
	lifeMu    sync.Mutex
	state     lifeState
	startDone chan struct{} // closed when Start returns; set with starting
	joins     sync.WaitGroup
	started   atomic.Bool // running (or closed after running)
	closeOnce sync.Once
	closeDone chan struct{} // closed when Close has finished
	closed    atomic.Bool
	calls     handlerCalls // the goroutines running a Handler call
	leaving   atomic.Bool

	subs     subscribers
	metrics  *metrics
	traffic  traffic
	joinRand *rand.Rand // Start's retries draw their jitter here
	// timeline is the status page's history of table changes.
	timeline timeline
}

// lifeState is where a coordinator is in its life.
type lifeState int

const (
	lifeNew lifeState = iota
	lifeStarting
	lifeRunning
	lifeClosed
)

// claimRetransmitFactor multiplies memberlist's RetransmitMult for claims.
const claimRetransmitFactor = 3

// view is what the hot paths read: the table (over the members that are
// not leaving) and where every member listens.
type view struct {
	table       *ring.Table
	members     map[string]ownership.Member
	unreachable []string // members the reach check can't ping, sorted
	unheard     []string // members of the join's list this node has had no word from yet, sorted (reach.Unvouched)
}

// New validates cfg and returns a coordinator that has not joined anything:
// call Start.
func New(cfg Config) (*Coordinator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// The machine draws its jitter on the loop goroutine: give it a source
	// of its own, so a Rand shared by several coordinators is drawn from
	// only here.
	cfg.Rand = rand.New(rand.NewPCG(cfg.Rand.Uint64(), cfg.Rand.Uint64()))
	joinRand := rand.New(rand.NewPCG(cfg.Rand.Uint64(), cfg.Rand.Uint64()))
	inc, err := incarnation()
	if err != nil {
		return nil, err
	}
	reg, err := gossip.NewRegister(cfg.Ring.Partitions)
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:       cfg,
		self:      ownership.Node{Name: cfg.Name, Incarnation: inc},
		joinRand:  joinRand,
		log:       cfg.Logger.With("node", cfg.Name),
		reg:       reg,
		auth:      cfg.Authority,
		memberCh:  make(chan struct{}, 1),
		inputs:    make(chan input, 64),
		leaveCh:   make(chan struct{}),
		idleCh:    make(chan struct{}),
		closeDone: make(chan struct{}),
		inbox:     inbox{signal: make(chan struct{}, 1)},
		exch:      make(chan exchangeJob, exchangeQueue),
		stableCh:  make(chan string, exchangeQueue),
		opener:    gossip.Opener{Cluster: cfg.ClusterName, Keys: cfg.TokenKeys, Partitions: cfg.Ring.Partitions},
		askWindow: askWindow(cfg.Memberlist),
		metrics:   newMetrics(),
	}
	c.subs.tap = c.observeEvent
	c.leases = newRegistry(cfg.Ring.Partitions, func(t ownership.Token) {
		c.report(input{kind: inEnded, token: t})
	})
	if c.auth == nil {
		if c.auth, err = gossip.NewAuthority(reg, cfg.TokenKeys); err != nil {
			return nil, err
		}
		c.cfg.Authority = c.auth
	}
	c.stable.Store(&quorum.Stable{})
	c.metaVal = meta{
		Cluster:     cfg.ClusterName,
		RingVersion: ring.AlgorithmVersion,
		Incarnation: inc,
		ServiceAddr: cfg.ServiceAddr,
	}
	if err := c.updateMeta(func(*meta) {}); err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// incarnation draws the incarnation from crypto/rand: it must never repeat
// across the lives of a node (S3), however Config.Rand is seeded.
func incarnation() (uint64, error) {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("coordinator: incarnation: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1, nil
}

// pushMeta gossips this node's current metadata. memberlist's UpdateNode
// is not safe to run concurrently with itself: calls are serialized here.
func (c *Coordinator) pushMeta() error {
	c.pushMu.Lock()
	defer c.pushMu.Unlock()
	c.traffic.metaUpdates.Add(1)
	return c.ml.UpdateNode(c.cfg.LeaveTimeout)
}

// updateMeta changes this node's metadata with fn and re-encodes it.
// Gossip sees it at the next memberlist UpdateNode.
func (c *Coordinator) updateMeta(fn func(*meta)) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	m := c.metaVal
	fn(&m)
	b, err := m.encode(c.cfg.Name, c.cfg.TokenKeys)
	if err != nil {
		return err
	}
	c.metaVal = m
	c.meta.Store(&b)
	return nil
}

// Self returns this node's name and incarnation.
func (c *Coordinator) Self() ownership.Node { return c.self }

// Config returns the effective configuration: the one given to New with
// every default filled in.
func (c *Coordinator) Config() Config { return c.cfg }

// Start starts gossip, joins Config.Seeds (if any) and starts claiming the
// partitions the ring gives this node once it has a quorum. A node with no
// seeds starts a cluster of its own.
//
// A seed that is busy or not up yet is normal while a cluster starts: a
// join that fails (no seed answered) is logged at Info and tried again,
// after RetryInterval doubling up to MaxRetryInterval, with jitter drawn
// from Config.Rand and waited on Config.Clock, until one seed answers or
// ctx ends. Bound ctx to bound the wait.
//
// A coordinator starts once: Start again returns ErrStarted (ErrClosed
// once closed). If ctx ends before a seed answered, Start returns an error
// wrapping ctx's error and the last join's error, and the coordinator is
// closed (gossip stopped): make a new one with New to try again. A Close
// during Start aborts the join at once; Start then returns an error
// wrapping ErrClosed.
func (c *Coordinator) Start(ctx context.Context) error {
	c.lifeMu.Lock()
	switch c.state {
	case lifeNew:
	case lifeClosed:
		c.lifeMu.Unlock()
		return ErrClosed
	default:
		c.lifeMu.Unlock()
		return ErrStarted
	}
	c.state = lifeStarting
	done := make(chan struct{})
	c.startDone = done
	c.lifeMu.Unlock()

	err := c.start(ctx)
	close(done)
	if err == nil {
		return nil
	}
	c.lifeMu.Lock()
	closed := c.state == lifeClosed // a Close ran meanwhile
	c.lifeMu.Unlock()
	c.Close()
	if closed && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("coordinator: start: %w (%v)", ErrClosed, err)
	}
	return err
}

func (c *Coordinator) start(ctx context.Context) error {
	mc := *c.cfg.Memberlist // a copy: the caller's config is not changed
	mc.Name = c.cfg.Name
	mc.BindAddr, mc.BindPort = c.cfg.BindAddr, c.cfg.BindPort
	if c.cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr, mc.AdvertisePort = c.cfg.AdvertiseAddr, c.cfg.AdvertisePort
	}
	if len(c.cfg.GossipKeys) > 0 {
		kr, err := memberlist.NewKeyring(c.cfg.GossipKeys, c.cfg.GossipKeys[0])
		if err != nil {
			return fmt.Errorf("coordinator: gossip keys: %w", err)
		}
		mc.Keyring, c.mlKeys = kr, kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Label = c.cfg.Label
	d := &delegate{c: c}
	c.dlg = d
	mc.Delegate, mc.Events, mc.Alive, mc.Merge = d, d, d, d
	mc.Conflict = d
	if c.cfg.MinQuorum != 1 {
		mc.Ping = &c.acks // word from members while this node starts (reach.go)
	}
	mc.Logger = slog.NewLogLogger(c.log.Handler(), slog.LevelDebug)
	mc.LogOutput = nil
	tr, err := newTransport(&mc, mc.Logger, &c.traffic)
	if err != nil {
		return err
	}
	mc.Transport = tr
	// Claims are few and small, and a node that misses one waits a whole
	// push/pull interval. memberlist piggybacks broadcasts on pings and
	// acks, so a message's transmissions are not spread evenly over the
	// members: send each claim more often than memberlist sends its own
	// state. The member count is the delegate's, not memberlist's
	// NumMembers: that takes memberlist's node lock, and the queue asks
	// under its own (see delegate.live).
	c.bq = newBroadcastQueue(claimRetransmitFactor*mc.RetransmitMult, d.numNodes)
	ml, err := memberlist.Create(&mc)
	if err != nil {
		_ = tr.Shutdown()
		return fmt.Errorf("coordinator: start gossip: %w", err)
	}
	c.mlp.Store(ml)
	c.lifeMu.Lock()
	if c.state == lifeClosed {
		// Close ran before there was a memberlist to shut down.
		c.lifeMu.Unlock()
		_ = ml.Shutdown()
		return ErrClosed
	}
	c.ml = ml
	c.lifeMu.Unlock()
	// memberlist's LocalNode is rewritten by UpdateNode without a lock the
	// caller can take: read the address once, before anything updates it.
	n := ml.LocalNode()
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	c.gossipAddr.Store(&addr)
	if len(c.cfg.Seeds) > 0 {
		if err := c.joinSeeds(ctx, ml); err != nil {
			return err
		}
	}
	m, err := machine.NewMachine(c.machineConfig())
	if err != nil {
		return err
	}
	l := newLoop(c, m)
	if len(c.cfg.Seeds) > 0 && c.cfg.MinQuorum != 1 {
		// What the join took from the seeds is their word, not this
		// node's: hearsay while it starts (see reach.Joined). With no
		// quorum to count there is none.
		l.reach.Joined(c.cfg.Clock.Now(), c.joinedWith())
	}
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.state == lifeClosed {
		return ErrClosed
	}
	c.state = lifeRunning
	c.started.Store(true)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.run()
	}()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runExchange()
	}()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runStableAnswers()
	}()
	c.log.Info("started", "incarnation", fmt.Sprintf("%016x", c.self.Incarnation), "gossip", addr, "seeds", len(c.cfg.Seeds))
	return nil
}

// joinSeeds joins Config.Seeds for Start. A seed that is busy or not up
// yet is normal while a cluster starts: a failed join is logged at Info
// and tried again after RetryInterval, doubling up to MaxRetryInterval,
// with jitter, until ctx ends. memberlist's Join has no context: when ctx
// ends or Close runs, gossip is shut down, which ends the join's dials and
// streams at once.
func (c *Coordinator) joinSeeds(ctx context.Context, ml *memberlist.Memberlist) error {
	backoff := c.cfg.RetryInterval
	var last error
	for attempt := 1; ; attempt++ {
		done := make(chan error, 1)
		go func() {
			_, err := ml.Join(c.cfg.Seeds)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				return nil
			}
			last = err
		case <-ctx.Done():
			_ = ml.Shutdown()
			<-done
			return c.joinAborted(ctx.Err(), last)
		case <-c.ctx.Done():
			_ = ml.Shutdown()
			<-done
			return c.joinAborted(ErrClosed, last)
		}
		// Half the backoff, plus up to as much again at random: nodes
		// started together don't retry together. At least a nanosecond: a
		// clock's ticker refuses zero (RetryInterval may be 1ns).
		wait := max(backoff/2+time.Duration(c.joinRand.Int64N(int64(backoff/2)+1)), time.Nanosecond)
		c.log.Info("join failed; trying again", "seeds", c.cfg.Seeds, "attempt", attempt, "retry_in", wait, "err", last)
		tick, stop := c.cfg.Clock.NewTicker(wait)
		select {
		case <-tick:
			stop()
		case <-ctx.Done():
			stop()
			_ = ml.Shutdown()
			return c.joinAborted(ctx.Err(), last)
		case <-c.ctx.Done():
			stop()
			_ = ml.Shutdown()
			return c.joinAborted(ErrClosed, last)
		}
		backoff = min(2*backoff, c.cfg.MaxRetryInterval)
	}
}

// joinAborted is Start's error when cause (ctx's error or ErrClosed) ended
// the join; it wraps the last join's error too, if one failed.
func (c *Coordinator) joinAborted(cause, last error) error {
	if last == nil {
		return fmt.Errorf("coordinator: join %v: %w", c.cfg.Seeds, cause)
	}
	return fmt.Errorf("coordinator: join %v: %w (last attempt: %w)", c.cfg.Seeds, cause, last)
}

// running returns nil while the coordinator runs: ErrClosed once it is
// closed (whether or not it ever started), else ErrNotStarted.
func (c *Coordinator) running() error {
	if c.closed.Load() {
		return ErrClosed
	}
	if !c.started.Load() {
		return ErrNotStarted
	}
	return nil
}

func (c *Coordinator) numMembers() int {
	ml := c.mlp.Load()
	if ml == nil {
		return 1
	}
	return ml.NumMembers()
}

// Join joins more gossip addresses (host:port). It returns once at least one
// answered, or the error when none did. If ctx ends first it returns ctx's
// error, and if Close runs, ErrClosed; memberlist's join can't be
// cancelled, so it may still complete after ctx ended (it ends at Close at
// the latest, which waits for it).
func (c *Coordinator) Join(ctx context.Context, seeds []string) error {
	c.lifeMu.Lock()
	switch c.state {
	case lifeRunning:
	case lifeClosed:
		c.lifeMu.Unlock()
		return ErrClosed
	default:
		c.lifeMu.Unlock()
		return ErrNotStarted
	}
	ml := c.ml
	c.joins.Add(1)
	c.lifeMu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer c.joins.Done()
		_, err := ml.Join(seeds)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("coordinator: join %v: %w", seeds, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("coordinator: join %v: %w", seeds, ctx.Err())
	case <-c.ctx.Done():
		return fmt.Errorf("coordinator: join %v: %w", seeds, ErrClosed)
	}
}

// GossipAddr returns the address other nodes join this one at ("" until
// Start has started gossip).
func (c *Coordinator) GossipAddr() string {
	if a := c.gossipAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// GossipKeyring returns memberlist's keyring for rotating gossip keys at
// run time (AddKey, UseKey, RemoveKey), or nil when gossip isn't encrypted.
func (c *Coordinator) GossipKeyring() *memberlist.Keyring { return c.mlKeys }

// Leaving reports whether Leave has been called.
func (c *Coordinator) Leaving() bool { return c.leaving.Load() }

// Leave hands off every partition this node holds and leaves the cluster:
//
//  1. it announces that it is leaving (in its gossip metadata): the others
//     drop it from their ring at once, but it stays a member, so callers
//     may still reach it and it still serves what it holds;
//  2. each handler drains (Release) and the release is published, so the
//     next owner claims at once (L2: no rejected write); once every
//     partition is released, this node also pushes its state (the
//     releases and its metadata) to each new owner over TCP, so a
//     handoff does not wait for gossip, which a busy machine delays;
//  3. it waits until the new holders are heard (at most HandoffTimeout),
//     says goodbye (in its gossip metadata, to each live member over
//     TCP, then to memberlist) and closes the coordinator. A member that
//     hears the goodbye drops this node from its stable membership at
//     once; one that misses it (a split) counts the departure as a crash.
//
// After Leave, Owner, OwnerOfPartition, Table and Members keep answering
// from the last view, so a leaving server can forward the calls still in
// flight to the new owners; Lease answers with a *NotOwnerError. If ctx
// ends first, the remaining leases end as in Close and ctx's error is
// returned; if Close runs meanwhile, Leave returns ErrClosed. Whatever it
// returns, the coordinator is closed when Leave returns. Before Start,
// Leave returns ErrNotStarted; after Close, or while another Leave runs,
// ErrClosed.
//
// A Handler may call Leave from its Acquire or Release. The handoff waits
// for every handler call, that one too, so there Leave only announces the
// leave and returns nil: steps 2 and 3 go on once the call returns, and
// the coordinator closes at their end. ctx's values reach them but not
// its end (a handler's ctx ends with its call): ReleaseTimeout and
// HandoffTimeout bound them, and Close cuts them short.
func (c *Coordinator) Leave(ctx context.Context) error {
	if err := c.running(); err != nil {
		return err
	}
	if !c.leaving.CompareAndSwap(false, true) {
		return ErrClosed // another Leave runs or ran
	}
	c.subs.publish(Event{Kind: EventLeaving, Node: c.cfg.Name, Time: c.cfg.Clock.Now()})
	if err := c.updateMeta(func(m *meta) { m.Leaving = true }); err == nil {
		if err := c.pushMeta(); err != nil {
			c.log.Debug("leave: metadata update", "err", err)
		}
	}
	if c.calls.inCall() {
		// The loop waits for this handler call before it ends, so wg's
		// count is above zero here: Add may run beside Close's Wait.
		ctx = context.WithoutCancel(ctx)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := c.leave(ctx); err != nil {
				c.log.Warn("leave", "err", err)
			}
		}()
		return nil
	}
	err := c.leave(ctx)
	<-c.closeDone
	return err
}

// leave hands off, says goodbye and starts the close; it does not wait for
// the close to finish (Close may be waiting for it).
func (c *Coordinator) leave(ctx context.Context) error {
	err := c.handOff(ctx)
	if err == nil || !errors.Is(err, ErrClosed) {
		// The goodbye, before memberlist's: a member that hears it counts
		// this node's drop as a graceful leave. pushMeta waits until
		// memberlist has sent it (at most LeaveTimeout); one that misses
		// it counts the drop as a crash.
		if gerr := c.updateMeta(func(m *meta) { m.Gone = true }); gerr == nil {
			if perr := c.pushMeta(); perr != nil {
				c.log.Debug("leave: goodbye", "err", perr)
			}
			c.sayGoodbye(ctx)
		}
		if lerr := c.memberlistLeave(); errors.Is(lerr, ErrClosed) && err == nil {
			err = lerr // Close cut the goodbye short
		} else if lerr != nil && err == nil {
			c.log.Warn("leave broadcast", "err", lerr)
		}
	}
	c.shutdown()
	if err != nil {
		return fmt.Errorf("coordinator: leave: %w", err)
	}
	return nil
}

// handOff releases every partition and waits for the new holders.
func (c *Coordinator) handOff(ctx context.Context) error {
	select {
	case c.leaveCh <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
	select {
	case <-c.idleCh:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
	// Gossip carries the releases and the metadata saying this node
	// leaves separately, and under load late: until a new owner has both
	// it may not claim. Hand them to the new owners directly.
	pushed := c.pushToSuccessors()
	defer pushed.Wait()
	// The deadline is the Clock's, as every other timeout of the
	// coordinator, checked at each tick.
	tick, stop := c.cfg.Clock.NewTicker(c.cfg.TickInterval)
	defer stop()
	deadline := c.cfg.Clock.Now().Add(c.cfg.HandoffTimeout)
	for !c.handedOff() || c.bq.NumQueued() > 0 && c.numMembers() > 1 {
		if !c.cfg.Clock.Now().Before(deadline) {
			return nil
		}
		select {
		case <-tick:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
	return nil
}

// pushToSuccessors exchanges state (a push/pull) with each member the
// table gives a partition this node released, at once and in parallel:
// the push carries the releases and this node's metadata, so a new owner
// may claim without waiting for gossip. A push that fails leaves gossip
// to do it. The returned group ends when every push has.
func (c *Coordinator) pushToSuccessors() *sync.WaitGroup {
	var wg sync.WaitGroup
	v := c.view.Load()
	if v == nil || v.table == nil {
		return &wg
	}
	seen := map[string]bool{c.self.Name: true}
	for p := range uint32(c.cfg.Ring.Partitions) {
		cl := c.reg.GetClaim(p)
		n := v.table.Owner(p)
		m, ok := v.members[n]
		if cl.Token.Owner != c.self.Name || !cl.Released || seen[n] || !ok {
			continue
		}
		seen[n] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.ml.Join([]string{m.GossipAddr}); err != nil {
				c.log.Debug("leave: push to the new owner", "member", n, "err", err)
			}
		}()
	}
	return &wg
}

// handedOff reports whether every partition this node released last has a
// new holder, as gossip shows.
func (c *Coordinator) handedOff() bool {
	v := c.view.Load()
	if v == nil || v.table == nil {
		return true
	}
	for p := range uint32(c.cfg.Ring.Partitions) {
		cl := c.reg.GetClaim(p)
		if cl.Token.Owner == c.self.Name && cl.Released && v.table.Owner(p) != c.self.Name {
			return false
		}
	}
	return true
}

// goodbyeFanout bounds the goodbyes sayGoodbye has in flight at once.
const goodbyeFanout = 16

// sayGoodbye sends this node's goodbye (its metadata, which says Gone) to
// every member of its view over a stream too, those the reach check does
// not name unreachable first. Gossip gives the goodbye a few transmits,
// which may all go to members lately lost to a split, and a member that
// misses it counts this node's drop as a crash (it keeps the node in its
// stable membership until a promotion). Best effort: it waits for the
// sends at most LeaveTimeout by the Clock, or until ctx ends; a send still
// running then (each is bounded by memberlist's TCPTimeout) ends with the
// close, which waits for it.
func (c *Coordinator) sayGoodbye(ctx context.Context) {
	v := c.view.Load()
	if v == nil {
		return
	}
	var to, late []*memberlist.Node
	for name, m := range v.members {
		ap, err := netip.ParseAddrPort(m.GossipAddr)
		if name == c.cfg.Name || err != nil {
			continue
		}
		n := &memberlist.Node{Name: name, Addr: ap.Addr().AsSlice(), Port: ap.Port()}
		if slices.Contains(v.unreachable, name) {
			late = append(late, n)
		} else {
			to = append(to, n)
		}
	}
	to = append(to, late...)
	if len(to) == 0 {
		return
	}
	b := encodeGoodbye(c.cfg.Name, *c.meta.Load())
	c.lifeMu.Lock()
	if c.state == lifeClosed {
		c.lifeMu.Unlock()
		return
	}
	c.joins.Add(len(to)) // before Close's Wait, which runs once the state says closed
	c.lifeMu.Unlock()
	var pending atomic.Int32
	pending.Store(int32(len(to)))
	done, stop := make(chan struct{}), make(chan struct{})
	defer close(stop)
	sem := make(chan struct{}, goodbyeFanout)
	for _, n := range to {
		go func() {
			defer c.joins.Done()
			defer func() {
				if pending.Add(-1) == 0 {
					close(done)
				}
			}()
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			defer func() { <-sem }()
			select {
			case <-stop:
				return
			default:
			}
			defer func() {
				if r := recover(); r != nil && !c.closed.Load() {
					panic(r) // not Close's: not ours to hide
				}
			}()
			if err := c.ml.SendReliable(n, b); err != nil {
				c.log.Debug("leave: goodbye", "to", n.Name, "err", err)
			}
		}()
	}
	tick, stopTick := c.cfg.Clock.NewTicker(c.cfg.TickInterval)
	defer stopTick()
	deadline := c.cfg.Clock.Now().Add(c.cfg.LeaveTimeout)
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-c.ctx.Done():
			return
		case <-tick:
			if !c.cfg.Clock.Now().Before(deadline) {
				return
			}
		}
	}
}

// memberlistLeave is memberlist's Leave, which panics ("leave after
// shutdown") when Close shut memberlist down first: Close may run during a
// Leave, and then the goodbye ends with ErrClosed, not a crash.
func (c *Coordinator) memberlistLeave() (err error) {
	if c.closed.Load() {
		return ErrClosed
	}
	defer func() {
		if r := recover(); r != nil {
			if !c.closed.Load() {
				panic(r) // not Close's: not ours to hide
			}
			err = ErrClosed
		}
	}()
	return c.ml.Leave(c.cfg.LeaveTimeout)
}

// Close stops the coordinator at once: every lease ends (the handlers are
// told: Release with the lease already ended, bounded by ReleaseTimeout),
// gossip stops without a goodbye (to the others, this is a crash), and the
// coordinator's goroutines end before Close returns. Dials and streams in
// progress end at once, so a Start or Join in flight returns (an error
// wrapping ErrClosed). memberlist's own prober may run on for up to one
// probe round (ProbeInterval, scaled by memberlist's awareness): its
// Shutdown does not wait for it. Close may be called at any time, before
// Start, during Start or Leave, and more than once; it always returns nil.
// It waits for the Handler's calls in progress, except when a Handler's
// Acquire or Release calls it: then it does not wait for the call it is
// called from (that would wait for itself), and the close finishes once
// the call returns. A goroutine the handler waits for is not the handler's
// call: Close from there waits as from anywhere else.
func (c *Coordinator) Close() error {
	c.shutdown()
	if !c.calls.inCall() {
		<-c.closeDone
	}
	return nil
}

// shutdown starts the close, once: it ends everything that could hold the
// coordinator's goroutines, and leaves the wait for them to a goroutine of
// its own, which closes closeDone at its end. It does not wait for
// anything a Handler's call may be holding.
func (c *Coordinator) shutdown() {
	c.closeOnce.Do(func() {
		c.lifeMu.Lock()
		c.state = lifeClosed
		c.closed.Store(true)
		ml, starting := c.ml, c.startDone
		c.lifeMu.Unlock()
		c.cancel() // aborts a Start's join and ends Join calls
		if ml != nil {
			// First, so joins, dials and push/pulls in flight end now.
			_ = ml.Shutdown()
		}
		go func() {
			defer close(c.closeDone)
			if starting != nil {
				<-starting // Start shuts down what it made after Close looked
			}
			c.wg.Wait() // the loop ends leases and waits for its workers
			c.joins.Wait()
			c.subs.closeAll()
			c.log.Info("closed")
		}()
	})
}

// Table returns the current partition table (nil before Start). While
// every member is leaving, it is the last table there was.
func (c *Coordinator) Table() *ring.Table {
	if v := c.view.Load(); v != nil {
		return v.table
	}
	return nil
}

// Owner returns the owner of key's partition as this node sees it.
func (c *Coordinator) Owner(key []byte) (ownership.OwnerInfo, error) {
	v := c.view.Load()
	if v == nil || v.table == nil {
		return ownership.OwnerInfo{}, ownership.ErrNoOwner
	}
	p, owner := v.table.Lookup(key)
	return c.ownerInfo(v, p, owner)
}

// OwnerOfPartition returns the owner of partition p as this node sees it.
func (c *Coordinator) OwnerOfPartition(p uint32) (ownership.OwnerInfo, error) {
	v := c.view.Load()
	if v == nil || v.table == nil || int(p) >= v.table.Partitions() {
		return ownership.OwnerInfo{}, ownership.ErrNoOwner
	}
	return c.ownerInfo(v, p, v.table.Owner(p))
}

func (c *Coordinator) ownerInfo(v *view, p uint32, owner string) (ownership.OwnerInfo, error) {
	if owner == "" {
		return ownership.OwnerInfo{}, ownership.ErrNoOwner
	}
	info := ownership.OwnerInfo{Partition: p, Node: owner, Addr: v.members[owner].ServiceAddr}
	if cl := c.reg.GetClaim(p); !cl.Released && cl.Token.Owner == owner {
		info.Token = cl.Token
	}
	return info, nil
}

// Lease returns this node's live lease on key's partition, or a
// *ownership.NotOwnerError. The lease may end at any moment after it is
// returned: pass its token to every write (the resource is the judge) and
// its context to every call. A lease is returned only once it is fenced
// and its Handler.Acquire has returned, and no more once its Release has
// begun.
func (c *Coordinator) Lease(key []byte) (*ownership.Lease, error) {
	v := c.view.Load()
	if v == nil || v.table == nil {
		return nil, ownership.ErrNoOwner
	}
	p, owner := v.table.Lookup(key)
	return c.leaseOf(v, p, owner)
}

// LeaseOfPartition is Lease for a partition number.
func (c *Coordinator) LeaseOfPartition(p uint32) (*ownership.Lease, error) {
	v := c.view.Load()
	if v == nil || v.table == nil || int(p) >= c.cfg.Ring.Partitions {
		return nil, ownership.ErrNoOwner
	}
	return c.leaseOf(v, p, v.table.Owner(p))
}

func (c *Coordinator) leaseOf(v *view, p uint32, owner string) (*ownership.Lease, error) {
	if l := c.leases.lookup(p); l != nil {
		return l, nil
	}
	info, err := c.ownerInfo(v, p, owner)
	if err != nil {
		return nil, err
	}
	return nil, &ownership.NotOwnerError{Owner: info}
}

// Members returns the members of the current view, leaving ones
// included, sorted by name.
func (c *Coordinator) Members() []ownership.Member {
	v := c.view.Load()
	if v == nil {
		return nil
	}
	out := make([]ownership.Member, 0, len(v.members))
	for _, m := range v.members {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ownership.Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Resign gives this node's lease on partition p back: the handler drains
// (Release), the release is published, and the node backs off
// (RetryInterval, doubling) before it claims the partition again. It
// returns once the machine has taken the request, not when the release is
// done; an error wrapping ownership.ErrLeaseEnded if the node holds no
// lease on p. A handler that ends its lease with Lease.End is treated the
// same way, without the drain.
func (c *Coordinator) Resign(ctx context.Context, p uint32) error {
	if err := c.running(); err != nil {
		return err
	}
	if int(p) >= c.cfg.Ring.Partitions {
		return fmt.Errorf("coordinator: resign p%d: %w", p, ownership.ErrPartitionRange)
	}
	done := make(chan error, 1)
	select {
	case c.inputs <- input{kind: inResign, partition: p, done: done}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		// The loop answers before the drain starts, and the drain (a
		// handler that closes the coordinator) may end c.ctx at once:
		// an answer given counts, whichever select case won.
		select {
		case err = <-done:
		default:
			return ErrClosed
		}
	}
	if err != nil {
		return fmt.Errorf("coordinator: resign p%d: %w", p, err)
	}
	return nil
}

// ReportStale tells the coordinator that a write under one of its leases
// was refused by a resource: err is what the resource returned. It
// reports whether err concerned a lease of this node:
//
//   - a *ownership.StaleTokenError for this node's token: the lease ends at
//     once, and the node won't claim the partition again until membership
//     changes (L5). The resource's current token is believed only if it is
//     authentic (a valid MAC, when Config.TokenKeys is set) and no more
//     than gossip.MaxEpochJump above what this node knows: a resource
//     can't make a partition unclaimable;
//   - a *ownership.NotFencedError for this node's token: the resource lost
//     its fence (a reset, a restore); the lease ends, the handler is told,
//     and a new lease is fenced, so the handler reads the resource again.
func (c *Coordinator) ReportStale(err error) bool {
	var st *ownership.StaleTokenError
	var nf *ownership.NotFencedError
	switch {
	case errors.As(err, &st) && st.Token.Node() == c.self:
		cur := st.Current
		if verr := c.currentError(st.Token, cur); verr != nil {
			c.log.Warn("stale report with a current token that is not believed", "token", st.Token, "current", cur, "err", verr)
			return false
		}
		c.metrics.staleRejections.Inc()
		return c.report(input{kind: inRejected, token: st.Token, current: cur})
	case errors.As(err, &nf) && nf.Token.Node() == c.self:
		return c.report(input{kind: inNotFenced, token: nf.Token})
	}
	return false
}

// report hands an input to the loop unless the coordinator is closing.
func (c *Coordinator) report(in input) bool {
	if c.ctx.Err() != nil {
		return false // the queue may have room, but no loop will read it
	}
	select {
	case c.inputs <- in:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// WaitConverged blocks until this node's view is settled: every partition
// is held, as gossip shows, by the member the ring assigns it to, this
// node's own partitions are served here, and no lease is in transit. Call
// it on every node to wait for a whole cluster.
//
// Before Start it returns ErrNotStarted at once, as Leave, Join and Resign
// do: nothing would ever converge. While a Start runs it waits, so it may
// be called beside a Start in flight; a caller that starts the node in
// another goroutine waits for that Start to return (or to have begun)
// before it calls WaitConverged. Once the coordinator is closed it returns
// ErrClosed; if ctx ends first, an error wrapping ctx's.
func (c *Coordinator) WaitConverged(ctx context.Context) error {
	c.lifeMu.Lock()
	state := c.state
	c.lifeMu.Unlock()
	switch state {
	case lifeNew:
		return ErrNotStarted
	case lifeClosed:
		return ErrClosed
	}
	tick, stop := c.cfg.Clock.NewTicker(c.cfg.TickInterval)
	defer stop()
	for {
		if c.converged() {
			return nil
		}
		select {
		case <-tick:
		case <-ctx.Done():
			return fmt.Errorf("coordinator: not converged: %w", ctx.Err())
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
}

func (c *Coordinator) converged() bool {
	v := c.view.Load()
	if v == nil || v.table == nil {
		return false
	}
	for p := range uint32(v.table.Partitions()) {
		owner := v.table.Owner(p)
		cl := c.reg.GetClaim(p)
		if cl.Released || cl.Token.Owner != owner {
			return false
		}
		l := c.leases.lookup(p)
		if owner == c.self.Name {
			if l == nil || !l.Token().Same(cl.Token) {
				return false
			}
		} else if l != nil {
			return false
		}
	}
	return true
}
