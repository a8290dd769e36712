package coordinator

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

// Sentinel errors of the coordinator. Test for them with errors.Is.
var (
	// ErrNotStarted: the call needs Start first.
	ErrNotStarted = errors.New("coordinator: not started")
	// ErrClosed: the coordinator was closed (or has left).
	ErrClosed = errors.New("coordinator: closed")
)

// Coordinator is one node's embedded ownership coordinator. Its methods
// are safe for concurrent use.
type Coordinator struct {
	cfg  Config
	self ownership.Node
	log  *slog.Logger

	reg  *ownership.Register
	auth ownership.Authority
	view atomic.Pointer[view]
	// leases holds this node's live lease per partition (Owned or
	// Releasing), for the lock-free Lease lookup.
	leases []atomic.Pointer[ownership.Lease]

	ml     *memberlist.Memberlist
	mlKeys *memberlist.Keyring
	bq     *memberlist.TransmitLimitedQueue
	meta   []byte

	inbox    inbox
	nodes    nodeSet
	memberCh chan struct{} // cap 1: membership changed
	results  chan result
	leaveCh  chan struct{}
	idleCh   chan struct{} // closed by the loop when idle after Leave

	ctx    context.Context // ends at Close: parent of every lease
	cancel context.CancelFunc
	wg     sync.WaitGroup

	startOnce sync.Once
	started   atomic.Bool
	closeOnce sync.Once
	closed    atomic.Bool
	leaving   atomic.Bool

	subs    subscribers
	metrics *metrics
	// timeline is the status page's history of table changes.
	timeline timeline
}

// claimRetransmitFactor multiplies memberlist's RetransmitMult for claims.
const claimRetransmitFactor = 3

// view is what the hot paths read: the table and where members listen.
type view struct {
	table   *ring.Table
	members map[string]ownership.Member
}

// New validates cfg and returns a coordinator that has not joined anything:
// call Start.
func New(cfg Config) (*Coordinator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	inc, err := incarnation(cfg)
	if err != nil {
		return nil, err
	}
	reg, err := ownership.NewRegister(cfg.Ring.Partitions)
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:      cfg,
		self:     ownership.Node{Name: cfg.Name, Incarnation: inc},
		log:      cfg.Logger.With("node", cfg.Name),
		reg:      reg,
		auth:     cfg.Authority,
		leases:   make([]atomic.Pointer[ownership.Lease], cfg.Ring.Partitions),
		memberCh: make(chan struct{}, 1),
		results:  make(chan result, 64),
		leaveCh:  make(chan struct{}),
		idleCh:   make(chan struct{}),
		inbox:    inbox{signal: make(chan struct{}, 1)},
		metrics:  newMetrics(),
	}
	c.subs.tap = c.observeEvent
	if c.auth == nil {
		if c.auth, err = ownership.NewGossipAuthority(reg, cfg.TokenKeys); err != nil {
			return nil, err
		}
	}
	c.meta, err = meta{
		Cluster:     cfg.ClusterName,
		RingVersion: ring.AlgorithmVersion,
		Incarnation: inc,
		ServiceAddr: cfg.ServiceAddr,
	}.encode()
	if err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

func incarnation(cfg Config) (uint64, error) {
	if cfg.Rand != nil {
		return cfg.Rand.Uint64() | 1, nil
	}
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("coordinator: incarnation: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1, nil
}

// Self returns this node's name and incarnation.
func (c *Coordinator) Self() ownership.Node { return c.self }

// Start starts gossip, joins Config.Seeds (if any; at least one must answer
// before ctx ends) and starts claiming the partitions the ring gives this
// node. A node with no seeds starts a cluster of its own.
func (c *Coordinator) Start(ctx context.Context) error {
	err := ErrClosed
	c.startOnce.Do(func() { err = c.start(ctx) })
	return err
}

func (c *Coordinator) start(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
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
	mc.Delegate, mc.Events, mc.Alive, mc.Merge = d, d, d, d
	mc.Conflict = d
	mc.Logger = slog.NewLogLogger(c.log.Handler(), slog.LevelDebug)
	mc.LogOutput = nil
	c.bq = &memberlist.TransmitLimitedQueue{
		NumNodes: func() int { return c.numMembers() },
		// Claims are few and small, and a node that misses one waits a
		// whole push/pull interval. memberlist piggybacks broadcasts on
		// pings and acks, so a message's transmissions are not spread
		// evenly over the members: send each claim more often than
		// memberlist sends its own state.
		RetransmitMult: claimRetransmitFactor * mc.RetransmitMult,
	}
	ml, err := memberlist.Create(&mc)
	if err != nil {
		return fmt.Errorf("coordinator: start gossip: %w", err)
	}
	c.ml = ml
	c.started.Store(true)
	if len(c.cfg.Seeds) > 0 {
		if err := c.join(ctx, c.cfg.Seeds); err != nil {
			_ = ml.Shutdown()
			c.closed.Store(true)
			c.cancel()
			return err
		}
	}
	m, err := ownership.NewMachine(ownership.MachineConfig{
		Self:          c.self,
		Partitions:    c.cfg.Ring.Partitions,
		GraceTicks:    c.cfg.ticks(c.cfg.Grace),
		HandoffTicks:  c.cfg.ticks(c.cfg.HandoffTimeout),
		StepDownTicks: c.cfg.ticks(c.cfg.StepDown),
		RetryTicks:    c.cfg.ticks(c.cfg.RetryInterval),
	})
	if err != nil {
		_ = ml.Shutdown()
		return err
	}
	l := newLoop(c, m)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.run()
	}()
	c.log.Info("started", "incarnation", c.self.Incarnation, "gossip", ml.LocalNode().Address())
	return nil
}

func (c *Coordinator) numMembers() int {
	if c.ml == nil {
		return 1
	}
	return c.ml.NumMembers()
}

// Join joins more gossip addresses (host:port). It returns once at least one
// answered, or the error when none did before ctx ended.
func (c *Coordinator) Join(ctx context.Context, seeds []string) error {
	if !c.started.Load() {
		return ErrNotStarted
	}
	if c.closed.Load() {
		return ErrClosed
	}
	return c.join(ctx, seeds)
}

func (c *Coordinator) join(ctx context.Context, seeds []string) error {
	done := make(chan error, 1)
	go func() {
		_, err := c.ml.Join(seeds)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("coordinator: join %v: %w", seeds, err)
		}
		return nil
	case <-ctx.Done():
		// memberlist's Join has no context; it ends within its TCP timeout.
		<-done
		return fmt.Errorf("coordinator: join %v: %w", seeds, ctx.Err())
	}
}

// GossipAddr returns the address other nodes join this one at.
func (c *Coordinator) GossipAddr() string {
	if c.ml == nil {
		return ""
	}
	n := c.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// GossipKeyring returns memberlist's keyring for rotating gossip keys at
// run time (AddKey, UseKey, RemoveKey), or nil when gossip isn't encrypted.
func (c *Coordinator) GossipKeyring() *memberlist.Keyring { return c.mlKeys }

// Leave hands off every partition this node holds (each handler drains and
// releases, and the release is published so the next owner claims at once),
// then leaves the gossip and closes the coordinator. If ctx ends first, the
// remaining leases are revoked as in Close and ctx's error is returned.
func (c *Coordinator) Leave(ctx context.Context) error {
	if !c.started.Load() {
		return ErrNotStarted
	}
	if !c.leaving.CompareAndSwap(false, true) || c.closed.Load() {
		return ErrClosed
	}
	c.subs.publish(Event{Kind: EventLeaving, Node: c.cfg.Name, Time: c.cfg.Clock.Now()})
	var err error
	select {
	case c.leaveCh <- struct{}{}:
		select {
		case <-c.idleCh:
			// Let the last releases go out before saying goodbye.
			err = c.flushBroadcasts(ctx)
		case <-ctx.Done():
			err = ctx.Err()
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if lerr := c.ml.Leave(c.cfg.LeaveTimeout); lerr != nil && err == nil {
		c.log.Warn("leave broadcast", "err", lerr)
	}
	c.Close()
	if err != nil {
		return fmt.Errorf("coordinator: leave: %w", err)
	}
	return nil
}

// flushBroadcasts waits until the broadcast queue is empty or ctx ends; the
// releases are also in push/pull state, so this only speeds up the handoff.
func (c *Coordinator) flushBroadcasts(ctx context.Context) error {
	tick, stop := c.cfg.Clock.NewTicker(c.cfg.TickInterval)
	defer stop()
	deadline := time.NewTimer(c.cfg.LeaveTimeout)
	defer deadline.Stop()
	for c.bq.NumQueued() > 0 && c.numMembers() > 1 {
		select {
		case <-tick:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close stops the coordinator at once: every lease is revoked, gossip stops
// without a goodbye (to the others, this is a crash), and every goroutine
// ends before Close returns. It is idempotent.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.cancel()
		c.wg.Wait() // the loop ends leases and waits for its workers
		if c.ml != nil {
			_ = c.ml.Shutdown()
		}
		for i := range c.leases {
			if l := c.leases[i].Swap(nil); l != nil {
				l.End(ErrClosed)
			}
		}
		c.subs.closeAll()
		c.log.Info("closed")
	})
	return nil
}

// Table returns the current partition table (nil before Start).
func (c *Coordinator) Table() *ring.Table {
	if v := c.view.Load(); v != nil {
		return v.table
	}
	return nil
}

// Owner returns the owner of key's partition as this node sees it.
func (c *Coordinator) Owner(key []byte) (ownership.OwnerInfo, error) {
	v := c.view.Load()
	if v == nil {
		return ownership.OwnerInfo{}, ownership.ErrNoOwner
	}
	p, owner := v.table.Lookup(key)
	return c.ownerInfo(v, uint32(p), owner)
}

// OwnerOfPartition returns the owner of partition p as this node sees it.
func (c *Coordinator) OwnerOfPartition(p uint32) (ownership.OwnerInfo, error) {
	v := c.view.Load()
	if v == nil || int(p) >= v.table.Partitions() {
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
// *ownership.NotOwnerError. The lease may end at any moment after it is returned:
// pass its token to every write (the resource is the judge) and its context
// to every call.
func (c *Coordinator) Lease(key []byte) (*ownership.Lease, error) {
	v := c.view.Load()
	if v == nil {
		return nil, ownership.ErrNoOwner
	}
	p, owner := v.table.Lookup(key)
	return c.leaseOf(v, uint32(p), owner)
}

// LeaseOfPartition is Lease for a partition number.
func (c *Coordinator) LeaseOfPartition(p uint32) (*ownership.Lease, error) {
	v := c.view.Load()
	if v == nil || int(p) >= len(c.leases) {
		return nil, ownership.ErrNoOwner
	}
	return c.leaseOf(v, p, v.table.Owner(p))
}

func (c *Coordinator) leaseOf(v *view, p uint32, owner string) (*ownership.Lease, error) {
	if l := c.leases[p].Load(); l != nil && l.Err() == nil {
		return l, nil
	}
	info, err := c.ownerInfo(v, p, owner)
	if err != nil {
		return nil, err
	}
	return nil, &ownership.NotOwnerError{Owner: info}
}

// Members returns the members of the current table's view, sorted by name.
func (c *Coordinator) Members() []ownership.Member {
	v := c.view.Load()
	if v == nil {
		return nil
	}
	out := make([]ownership.Member, 0, len(v.members))
	for _, name := range v.table.Members() {
		out = append(out, v.members[name])
	}
	return out
}

// ReportStale tells the coordinator that a write under one of its leases
// was rejected by a fence: err is what the fence returned. If err holds a
// *ownership.StaleTokenError for a lease of this node, the lease is revoked
// at once (the node won't claim the partition again until membership
// changes) and ReportStale returns true.
func (c *Coordinator) ReportStale(err error) bool {
	var st *ownership.StaleTokenError
	if !errors.As(err, &st) || st.Token.Owner != c.self.Name || st.Token.Incarnation != c.self.Incarnation {
		return false
	}
	c.metrics.staleRejections.Inc()
	select {
	case c.results <- result{kind: resRejected, token: st.Token, current: st.Current}:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// WaitConverged blocks until this node's view is settled: every partition
// is held, as gossip shows, by the member the ring assigns it to, this
// node's own partitions are Owned here, and no lease is in transit. Call it
// on every node to wait for a whole cluster.
func (c *Coordinator) WaitConverged(ctx context.Context) error {
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
	if v == nil {
		return false
	}
	for p := 0; p < v.table.Partitions(); p++ {
		owner := v.table.Owner(uint32(p))
		cl := c.reg.GetClaim(uint32(p))
		if cl.Released || cl.Token.Owner != owner {
			return false
		}
		l := c.leases[p].Load()
		if owner == c.self.Name {
			if l == nil || l.Token() != cl.Token {
				return false
			}
		} else if l != nil {
			return false
		}
	}
	return true
}
