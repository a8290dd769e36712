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
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/machine"
	"github.com/tenure-go/tenure/ring"
)

// Handler is the application's side of ownership. The coordinator calls it
// from its own goroutines, concurrently for different partitions but never
// concurrently for the same partition (unless a call overran its deadline,
// AcquireTimeout or ReleaseTimeout, and was abandoned: the late call, and
// the Release that follows an abandoned Acquire that returned nil, may run
// beside the next lease's calls; compare lease tokens before touching
// shared state). Both calls may block until ctx ends. Both may call
// Coordinator.Close or Leave: called from a handler's call, neither waits
// for that call (see there), but a goroutine the call waits for must not
// call them.
//
// For every lease whose Acquire returned nil, Release is called exactly
// once: before the lease ends for a planned move (the ring moved the
// partition, Leave, Resign), or after it ended for a lease that was lost
// (a higher token exists, the quorum was lost, the resource lost its fence,
// the Release deadline passed, Close). lease.Err() says which: nil means
// drain, anything else names the cause and the handler only cleans up.
type Handler interface {
	// Acquire is called when this node has been granted lease, after the
	// coordinator fenced Config.Fence (if set) with its token. Fence every
	// other resource the partition writes to with lease.Token() before
	// reading its state or serving (S2). An error ending in a
	// *ownership.StaleTokenError means another owner is ahead: the lease is
	// dropped and not claimed again until membership changes. Any other
	// error gives the claim back and retries after a backoff (RetryInterval,
	// doubling). Callers get the lease (Coordinator.Lease) only after
	// Acquire returned nil.
	Acquire(ctx context.Context, lease *ownership.Lease) error
	// Release is called once for every lease Acquire accepted (see
	// Handler). For a planned move the lease is live: new callers no longer
	// get it; drain the writes in flight and return. The lease ends when
	// Release returns or when ctx expires (ReleaseTimeout), whichever comes
	// first, and only then is the release published and the next owner
	// claims. For a lost lease, lease.Err() is not nil: clean up and return.
	Release(ctx context.Context, lease *ownership.Lease) error
}

// HandlerFuncs adapts two functions to a Handler; a nil function is a
// no-op that succeeds.
type HandlerFuncs struct {
	AcquireFunc func(ctx context.Context, lease *ownership.Lease) error
	ReleaseFunc func(ctx context.Context, lease *ownership.Lease) error
}

// Acquire calls AcquireFunc.
func (h HandlerFuncs) Acquire(ctx context.Context, l *ownership.Lease) error {
	if h.AcquireFunc == nil {
		return nil
	}
	return h.AcquireFunc(ctx, l)
}

// Release calls ReleaseFunc.
func (h HandlerFuncs) Release(ctx context.Context, l *ownership.Lease) error {
	if h.ReleaseFunc == nil {
		return nil
	}
	return h.ReleaseFunc(ctx, l)
}

// Clock is the coordinator's source of time: ownership.Clock, the one a
// sqlfence Batcher takes too. The default is the system clock; tests
// inject their own to run timers fast, slow, or with jumps.
type Clock = ownership.Clock

// SystemClock returns the real clock (ownership.SystemClock).
func SystemClock() Clock { return ownership.SystemClock() }

// Config configures a Coordinator. Build one from a preset (LocalConfig,
// LANConfig, WANConfig) and set Name, Handler and the addresses. Zero
// means "the default" for every field: a field left zero in a Config built
// by hand takes the LAN preset's value (the lines "Default:" below give the
// presets' values, and a test holds them to it).
type Config struct {
	// Name identifies the node in the cluster; unique and stable across
	// restarts (the incarnation tells restarts apart). At most 128 bytes.
	// Required.
	Name string
	// ClusterName: nodes with a different cluster name are refused, and so
	// is gossip that names another cluster.
	// Default: "tenure".
	ClusterName string
	// BindAddr and BindPort: where gossip listens (UDP and TCP). BindAddr
	// is an IP address, not a host name (unless Memberlist.Transport is
	// set, which binds instead); bound to 0.0.0.0 or ::, a node advertises
	// a private address of its host unless AdvertiseAddr is set. A
	// BindPort of 0 picks a free port (the LAN and WAN presets set 7946).
	// Default: BindAddr "0.0.0.0" (LAN, WAN), "127.0.0.1" (local).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort: the gossip address others use, when
	// it differs from the bind address (NAT, containers). Optional.
	AdvertiseAddr string
	AdvertisePort int
	// ServiceAddr is the address of this node's application endpoint (for
	// example its gRPC server), gossiped in metadata so that Owner can tell
	// callers where a key's owner listens. Optional, at most 128 bytes.
	ServiceAddr string
	// Seeds are gossip addresses (host:port) joined by Start (which tries
	// again, with backoff, until one answers or its context ends) and
	// re-joined while a lost member is due for a rejoin (see
	// RejoinInterval), so a healed network partition merges again. A node
	// with no seeds founds a cluster of its own; a node with seeds learns
	// the cluster's stable membership from them before it claims anything
	// (a whole cluster whose nodes all list each other as seeds forms once
	// its view has been unchanged for StableAfter).
	Seeds []string

	// Ring places partitions on members. Every node of a cluster must use
	// the same Ring config.
	// Default: ring.DefaultConfig().
	Ring ring.Config

	// Handler is told of acquired and released leases. Required.
	Handler Handler
	// Fence, when set, is fenced with every new token before
	// Handler.Acquire (the resource the partitions protect). Optional: the
	// handler may fence its resources itself.
	Fence ownership.Fence
	// Authority mints tokens. The SQL authority (ownership/sqlfence) gives
	// strict issuance (S4).
	// Default: the gossip authority (epochs from the gossiped max-epoch
	// register; no external system).
	Authority ownership.Authority
	// TokenKeys, when set, signs every token with a MAC (the first key;
	// the others are accepted for rotation), and authenticates gossip: every
	// message must carry a MAC under these keys, and so must every token in
	// it and every token a resource reports as current (ReportStale), and
	// every node's metadata carries a MAC for its name: a node whose
	// metadata fails is no member (it can't advertise a stable membership,
	// a leave or another node's identity). A MAC does not prove freshness:
	// without GossipKeys, a host that captured a member's metadata can
	// replay it under that member's name after the member has left, join
	// as that member and hold its partitions unowned for as long as it
	// answers pings (the fence keeps the data safe; availability suffers).
	// Set GossipKeys (memberlist's encryption) where the gossip network is
	// not trusted. Without them (and without
	// GossipKeys) the cluster trusts whatever reaches its gossip port, and
	// is not fully protected: a forged goodbye makes a member's next
	// crash count as a graceful leave, a plain memberlist node joins as a member,
	// can make every node hold back while it advertises a newer stable
	// membership, and a forged stable membership naming a quorum of real
	// members plus some that do not exist is adopted (one naming none that
	// exist, or jumping more than quorum.MaxStableJump versions, is
	// not).
	// Optional.
	TokenKeys *ownership.Keyring

	// GossipKeys encrypt gossip (AES, 16, 24 or 32 bytes each). The first
	// key encrypts; all of them decrypt, so keys rotate without downtime:
	// add the new key everywhere, make it first everywhere, then remove the
	// old one. Empty: gossip is not encrypted.
	GossipKeys [][]byte
	// Label is memberlist's cluster label: packets with another label are
	// dropped before decryption. Optional.
	Label string

	// TickInterval is the ownership state machine's logical tick: the
	// resolution of every timer below.
	// Default: LAN 100ms, WAN 250ms, local 20ms.
	TickInterval time.Duration
	// Grace is the wait before claiming the partitions of a node that left
	// the membership without releasing them (a crash or a partition). A
	// longer grace lets a cut-off owner step down before it is fenced
	// (fewer rejected writes); a shorter one fails over sooner. It must
	// exceed StepDown plus the spread of failure detection across nodes
	// (an isolated node detects the others' absence later than they detect
	// its own): while nodes disagree on who is gone, both sides of a split
	// can count a quorum for a moment. Safety does not depend on it.
	// Validate refuses a Grace that does not exceed StepDown.
	// Default: LAN 10s, WAN 30s, local 2.5s.
	Grace time.Duration
	// StepDown is how long a node that can't see a quorum of the stable
	// membership keeps serving before it ends every lease (L4).
	// Default: LAN 4s, WAN 15s, local 500ms.
	StepDown time.Duration
	// HandoffTimeout is the longest a new owner waits for a live previous
	// owner to release a partition before claiming it anyway (fencing the
	// previous owner). It is at least ReleaseTimeout + LeaveTimeout (New
	// raises a shorter one): a leaving node announces its leave (taking
	// up to LeaveTimeout) before it drains (taking up to ReleaseTimeout),
	// and a new owner that gave up sooner would fence a drain still
	// within its bound, rejecting the writes L2 promises to keep.
	// A previous owner that is leaving is waited for up to 4 times
	// HandoffTimeout (machine.LeaverWaitFactor), until its release is
	// heard or it is no longer a live member (then Grace applies): on a
	// busy machine its drain, timed on its own clock, can outlast the new
	// owner's count, and its Leave bounds it.
	// Default: LAN 10s, WAN 30s, local 2.5s.
	HandoffTimeout time.Duration
	// AcquireTimeout and ReleaseTimeout bound Handler calls (and the fence
	// and authority calls). Past ReleaseTimeout the lease ends even if
	// Release has not returned.
	// Default: LAN 5s, WAN 5s, local 2s.
	AcquireTimeout time.Duration
	// Default: LAN 5s, WAN 5s, local 2s.
	ReleaseTimeout time.Duration
	// RetryInterval is the first wait after a failed claim, fence or
	// acquire (or a Resign), and after Start's failed join; it doubles
	// with each failure in a row, up to MaxRetryInterval, with jitter.
	// Default: LAN 1s, WAN 1s, local 100ms.
	RetryInterval time.Duration
	// Default: LAN 30s, WAN 30s, local 3s.
	MaxRetryInterval time.Duration
	// RejoinInterval is how often the node re-joins the members it knew
	// that it no longer sees (memberlist never probes a dead node again),
	// two addresses at a time drawn at random from them and, while one is
	// missing, from its seeds (a seed written as a member's gossip address
	// is left out while that member is live). A member is re-joined once it
	// has been missing for two RejoinIntervals (or
	// Memberlist.GossipToTheDeadTime, if shorter): a member declared dead
	// by mistake (a busy machine) usually refutes it by itself. Then about
	// log2(members) of the members re-join it (at least two), drawn from
	// the names so that nodes that see the same members agree which, and
	// twice as many each RejoinInterval it stays missing, until every
	// member does (at 100 members, 4 intervals later). One join that gets through merges the
	// member lists; each join sends the whole register both ways.
	// Default: LAN 5s, WAN 15s, local 500ms.
	RejoinInterval time.Duration
	// ReconnectTimeout is how long a member that vanished without leaving
	// (a crash or a partition) is re-joined before it is forgotten, counted
	// from when this node lost it. One no longer than the wait before a
	// rejoin (see RejoinInterval) re-joins nothing.
	// Default: LAN 24h, WAN 72h, local 1m.
	ReconnectTimeout time.Duration
	// StableAfter: a membership unchanged for this long becomes the stable
	// membership against which quorum is counted, provided it holds a
	// quorum of the previous stable one. It must exceed the spread of
	// failure detection across nodes (memberlist's suspicion timeout, some
	// seconds): otherwise the minority side of a partition, which loses
	// sight of the others one at a time, could shrink its stable set step
	// by step and keep a quorum. Longer is safer; the cost is that the
	// stable set follows crashes slowly, so several crashes within
	// StableAfter count against the older, larger set. A node's metadata
	// shows a new stable membership at once after a quiet spell, but at
	// most once per StableAfter/4 in a burst (nodes starting one after
	// another): Status reports the set the node holds, which its
	// metadata may show up to that much later.
	// Default: LAN 30s, WAN 60s, local 5s.
	StableAfter time.Duration
	// MinQuorum, when > 0, replaces the majority rule: a node has a quorum
	// when it sees at least MinQuorum members (itself included). Use 1 to
	// turn quorum checks off (two-node clusters, say). Zero: the majority
	// rule.
	MinQuorum int
	// LeaveTimeout bounds the broadcast of the leave message after the
	// handoff.
	// Default: LAN 1s, WAN 1s, local 500ms.
	LeaveTimeout time.Duration

	// Memberlist is the base memberlist configuration the presets choose.
	// Name, addresses, delegates, keys and label are overwritten from the
	// fields above; the timings are used as they are. The coordinator never
	// changes the caller's copy.
	// Default: LAN memberlist.DefaultLANConfig(), WAN
	// memberlist.DefaultWANConfig(), local memberlist.DefaultLocalConfig()
	// with faster probes and no compression (see LocalConfig);
	// DeadNodeReclaimTime LAN 30s, WAN 60s, local 100ms.
	Memberlist *memberlist.Config

	// Logger receives the coordinator's logs (and memberlist's, at debug
	// level). Warnings are for what needs a person; expected races (a claim
	// lost to a concurrent claimant, say) log at debug.
	// Default: discard.
	Logger *slog.Logger
	// Clock drives the tick.
	// Default: SystemClock().
	Clock Clock
	// Rand draws the jitter of retries. It does not choose the incarnation,
	// which always comes from crypto/rand so that no two lives of a node
	// share a token, however Rand is seeded.
	// Default: a source seeded from crypto/rand.
	Rand *rand.Rand
}

// LANConfig returns the settings for nodes on one local network, on
// memberlist's DefaultLANConfig: failures detected in a few seconds.
func LANConfig() Config {
	ml := memberlist.DefaultLANConfig()
	ml.DeadNodeReclaimTime = 30 * time.Second
	return Config{
		ClusterName:      "tenure",
		BindAddr:         "0.0.0.0",
		BindPort:         7946,
		Ring:             ring.DefaultConfig(),
		TickInterval:     100 * time.Millisecond,
		StepDown:         4 * time.Second,
		Grace:            10 * time.Second,
		HandoffTimeout:   10 * time.Second,
		AcquireTimeout:   5 * time.Second,
		ReleaseTimeout:   5 * time.Second,
		RetryInterval:    time.Second,
		MaxRetryInterval: 30 * time.Second,
		RejoinInterval:   5 * time.Second,
		ReconnectTimeout: 24 * time.Hour,
		StableAfter:      30 * time.Second,
		LeaveTimeout:     time.Second,
		Memberlist:       ml,
	}
}

// WANConfig returns the settings for nodes across data centres, on
// memberlist's DefaultWANConfig: slower detection, fewer false alarms.
func WANConfig() Config {
	c := LANConfig()
	ml := memberlist.DefaultWANConfig()
	ml.DeadNodeReclaimTime = 60 * time.Second
	c.Memberlist = ml
	c.TickInterval = 250 * time.Millisecond
	c.StepDown = 15 * time.Second
	c.Grace = 30 * time.Second
	c.HandoffTimeout = 30 * time.Second
	c.RejoinInterval = 15 * time.Second
	c.ReconnectTimeout = 72 * time.Hour
	c.StableAfter = 60 * time.Second
	return c
}

// LocalConfig returns the settings for nodes on one machine (tests, demos):
// loopback, fast probes, sub-second failure detection, and no compression
// of gossip (loopback bytes are free; the machine's CPU is not).
func LocalConfig() Config {
	c := LANConfig()
	ml := memberlist.DefaultLocalConfig()
	// Fast, but not so tight that a loaded 2-core machine makes nodes
	// suspect each other (measured under a load average of 14).
	ml.ProbeInterval = 200 * time.Millisecond
	ml.ProbeTimeout = 100 * time.Millisecond
	ml.GossipInterval = 50 * time.Millisecond
	ml.SuspicionMult = 3
	ml.SuspicionMaxTimeoutMult = 2
	ml.PushPullInterval = 2 * time.Second
	ml.TCPTimeout = 2 * time.Second
	ml.GossipToTheDeadTime = 2 * time.Second
	ml.DeadNodeReclaimTime = 100 * time.Millisecond
	// Every node runs on one machine: bytes on loopback cost nothing, and
	// the CPU is every node's. memberlist compresses each packet with a new
	// LZW writer (a 64 KB allocation), pings included: at 100 nodes in one
	// process that was 12% of the CPU, and the largest share of the
	// garbage. Without it a converged node gossips about twice the bytes.
	ml.EnableCompression = false
	c.Memberlist = ml
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.TickInterval = 20 * time.Millisecond
	c.StepDown = 500 * time.Millisecond
	c.Grace = 2500 * time.Millisecond
	c.HandoffTimeout = 2500 * time.Millisecond
	c.AcquireTimeout = 2 * time.Second
	c.ReleaseTimeout = 2 * time.Second
	c.RetryInterval = 100 * time.Millisecond
	c.MaxRetryInterval = 3 * time.Second
	c.RejoinInterval = 500 * time.Millisecond
	c.ReconnectTimeout = time.Minute
	c.StableAfter = 5 * time.Second
	c.LeaveTimeout = 500 * time.Millisecond
	return c
}

// Validate reports the first problem with c. It does not change c; New
// fills unset fields with defaults on its own copy.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// WithDefaults returns c with every zero field set to its default (the LAN
// preset's value), or the first problem with c. It does not change c. New
// uses it; so can a caller that needs an effective value before New (the
// partition count: WithDefaults().Ring.Partitions).
func (c Config) WithDefaults() (Config, error) { return c.withDefaults() }

func (c Config) withDefaults() (Config, error) {
	d := LANConfig()
	str := func(p *string, def string) {
		if *p == "" {
			*p = def
		}
	}
	str(&c.ClusterName, d.ClusterName)
	str(&c.BindAddr, d.BindAddr)
	if c.Ring == (ring.Config{}) {
		c.Ring = d.Ring
	}
	if c.Memberlist == nil {
		c.Memberlist = d.Memberlist
	}
	dur := func(p *time.Duration, def time.Duration) {
		if *p == 0 {
			*p = def
		}
	}
	dur(&c.TickInterval, d.TickInterval)
	dur(&c.StepDown, d.StepDown)
	dur(&c.Grace, d.Grace)
	dur(&c.HandoffTimeout, d.HandoffTimeout)
	dur(&c.AcquireTimeout, d.AcquireTimeout)
	dur(&c.ReleaseTimeout, d.ReleaseTimeout)
	dur(&c.RetryInterval, d.RetryInterval)
	dur(&c.MaxRetryInterval, d.MaxRetryInterval)
	dur(&c.RejoinInterval, d.RejoinInterval)
	dur(&c.ReconnectTimeout, d.ReconnectTimeout)
	dur(&c.StableAfter, d.StableAfter)
	dur(&c.LeaveTimeout, d.LeaveTimeout)
	// A new owner must not give up on a drain still within its bound.
	c.HandoffTimeout = max(c.HandoffTimeout, c.ReleaseTimeout+c.LeaveTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = SystemClock()
	}
	if c.Rand == nil {
		var seed [16]byte
		if _, err := crand.Read(seed[:]); err != nil {
			return c, fmt.Errorf("coordinator: seed: %w", err)
		}
		c.Rand = rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:])))
	}
	switch {
	case c.Name == "":
		return c, errors.New("coordinator: Config.Name is empty")
	case len(c.Name) > 128:
		return c, errors.New("coordinator: Config.Name is longer than 128 bytes")
	case len(c.ServiceAddr) > 128:
		return c, errors.New("coordinator: Config.ServiceAddr is longer than 128 bytes")
	case len(c.ClusterName) > 64:
		return c, errors.New("coordinator: Config.ClusterName is longer than 64 bytes")
	case c.Handler == nil:
		return c, errors.New("coordinator: Config.Handler is nil")
	case c.TickInterval < 0 || c.StepDown < 0 || c.Grace < 0 || c.HandoffTimeout < 0 ||
		c.AcquireTimeout < 0 || c.ReleaseTimeout < 0 || c.RetryInterval < 0 || c.MaxRetryInterval < 0 ||
		c.RejoinInterval < 0 || c.ReconnectTimeout < 0 || c.StableAfter < 0 || c.LeaveTimeout < 0:
		return c, errors.New("coordinator: Config durations must not be negative")
	case c.Grace <= c.StepDown:
		return c, fmt.Errorf("coordinator: Config.Grace %v must exceed StepDown %v", c.Grace, c.StepDown)
	case c.MaxRetryInterval < c.RetryInterval:
		return c, fmt.Errorf("coordinator: Config.MaxRetryInterval %v is below RetryInterval %v", c.MaxRetryInterval, c.RetryInterval)
	case c.MinQuorum < 0:
		return c, errors.New("coordinator: Config.MinQuorum must not be negative")
	case c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535:
		return c, errors.New("coordinator: Config ports must be in 0..65535")
	case net.ParseIP(c.BindAddr) == nil && (c.Memberlist == nil || c.Memberlist.Transport == nil):
		return c, fmt.Errorf("coordinator: Config.BindAddr %q is not an IP address", c.BindAddr)
	}
	for i, k := range c.GossipKeys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return c, fmt.Errorf("coordinator: Config.GossipKeys[%d] is %d bytes, want 16, 24 or 32", i, n)
		}
	}
	if err := c.Ring.Validate(); err != nil {
		return c, fmt.Errorf("coordinator: Config.Ring: %w", err)
	}
	return c, nil
}

// ticks converts d to state-machine ticks, rounding up.
func (c Config) ticks(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + c.TickInterval - 1) / c.TickInterval)
}

// maxClaims bounds the claims a node has in flight at once: enough to
// claim hundreds of partitions in a few round trips, few enough that a
// database authority is not hit by all of them at one instant.
const maxClaims = 16

// showFraction: a node's metadata shows a new stable membership at most
// once per StableAfter/showFraction (machine.MachineConfig.ShowTicks).
// At 100 nodes x 4096 partitions in one process, every join made every
// node update its metadata at once: 102 alive messages per join, each
// handled and passed on by every member, half of a join's packet bytes,
// and every node that saw a newer ID before the set's broadcast asked for
// it. While nodes start one after another, a show every StableAfter/4
// (1.25 s on the local preset) cut a start's metadata updates about
// tenfold (issue 22). A change after a quiet spell (a crash's promotion, a
// leave) is still shown at once; only a burst's later changes wait, and a
// node learns from metadata that it is outdated at most that much later
// (the set's broadcast and push/pull carry it too).
const showFraction = 4

// machineConfig is the state machine's configuration for node self.
func (c Config) machineConfig(self ownership.Node) machine.MachineConfig {
	strict := c.Authority != nil && c.Authority.Strict()
	return machine.MachineConfig{
		Self:             self,
		Partitions:       c.Ring.Partitions,
		Bootstrap:        len(c.Seeds) == 0,
		MinQuorum:        c.MinQuorum,
		Fenced:           c.Fence != nil,
		StrictAuthority:  strict,
		GraceTicks:       c.ticks(c.Grace),
		HandoffTicks:     c.ticks(c.HandoffTimeout),
		StepDownTicks:    c.ticks(c.StepDown),
		StableAfterTicks: c.ticks(c.StableAfter),
		ShowTicks:        min(c.ticks(c.StableAfter/showFraction), c.ticks(c.StableAfter)/2),
		RetryTicks:       c.ticks(c.RetryInterval),
		MaxRetryTicks:    c.ticks(c.MaxRetryInterval),
		AcquireTicks:     c.ticks(c.AcquireTimeout),
		ReleaseTicks:     c.ticks(c.ReleaseTimeout),
		MaxClaims:        maxClaims,
		Rand:             c.Rand,
	}
}
