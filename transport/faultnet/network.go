package faultnet

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Sentinel errors. Errors returned by a Transport wrap one of these, so
// callers test them with errors.Is.
var (
	// ErrLinkDown is the cause of a stream dial refused by a fault (a
	// partition, a cut in either direction, an isolated node).
	ErrLinkDown = errors.New("faultnet: link down")

	// ErrClosed is returned by a Transport used after Shutdown.
	ErrClosed = errors.New("faultnet: transport shut down")

	// ErrInvalid is wrapped by every error caused by a bad argument.
	ErrInvalid = errors.New("faultnet: invalid argument")
)

// defaultSeed seeds the drop decisions of a Network built without WithSeed
// or WithRand, so a run is repeatable by default.
const defaultSeed = 1

// Option configures a Network built by New.
type Option func(*Network)

// WithSeed makes the Network's random drop decisions come from a PCG
// generator seeded with seed. The default seed is 1.
func WithSeed(seed uint64) Option {
	return func(n *Network) { n.rng = rand.New(rand.NewPCG(seed, seed)) }
}

// WithRand makes the Network's random drop decisions come from src. The
// Network takes ownership of src and calls it only while holding its own
// lock, so src need not be safe for concurrent use; the caller must not use
// it afterwards. A nil src is ignored.
func WithRand(src rand.Source) Option {
	return func(n *Network) {
		if src != nil {
			n.rng = rand.New(src)
		}
	}
}

// link is a directed pair of node names.
type link struct{ from, to string }

// Network is the fault controller shared by every Transport of one test
// cluster. It maps addresses to node names and decides, for each packet and
// stream, whether the current faults let it through.
//
// Faults are between node names, so they also apply to a node restarted
// under the same name on a new address. An endpoint that is not a Transport
// of this Network (an unknown address) is outside the fault model: only the
// network-wide drop fraction and delay apply to it.
//
// All methods are safe for concurrent use. A fault takes effect for every
// packet sent or delivered after the call returns.
type Network struct {
	mu     sync.Mutex
	rng    *rand.Rand
	byAddr map[netip.AddrPort]*Transport
	byName map[string]*Transport
	// dialers maps the local address of a stream dialed by a Transport to
	// the dialer's name, so the accepting side can attribute the stream.
	dialers map[netip.AddrPort]string

	groups   map[string]int
	cuts     map[link]struct{}
	isolated map[string]struct{}
	muted    map[string]struct{}
	drop     float64
	delay    time.Duration

	sent, dropped uint64
}

// New returns a Network with no faults.
func New(opts ...Option) *Network {
	n := &Network{
		byAddr:   make(map[netip.AddrPort]*Transport),
		byName:   make(map[string]*Transport),
		dialers:  make(map[netip.AddrPort]string),
		groups:   make(map[string]int),
		cuts:     make(map[link]struct{}),
		isolated: make(map[string]struct{}),
		muted:    make(map[string]struct{}),
	}
	WithSeed(defaultSeed)(n)
	for _, opt := range opts {
		if opt != nil {
			opt(n)
		}
	}
	return n
}

// Partition splits the named nodes into groups: two nodes in different
// groups can't exchange packets or open streams, in either direction. A
// node listed in no group keeps talking to every node (it bridges the
// groups). Partition replaces any earlier partition and leaves cuts,
// isolations, drops and delay alone; Partition() with no groups removes the
// partition. A name that is empty or listed twice is an error, and then
// nothing changes.
func (n *Network) Partition(groups ...[]string) error {
	next := make(map[string]int)
	for i, g := range groups {
		for _, name := range g {
			if name == "" {
				return fmt.Errorf("%w: empty node name in partition group %d", ErrInvalid, i)
			}
			if j, dup := next[name]; dup {
				return fmt.Errorf("%w: node %q is in partition groups %d and %d", ErrInvalid, name, j, i)
			}
			next[name] = i
		}
	}
	n.mu.Lock()
	n.groups = next
	n.mu.Unlock()
	return nil
}

// Cut drops every packet from node from to node to, while packets from to
// to from still pass. A stream needs both directions, as TCP does, so
// stream dials between the two are refused both ways. Names need not belong
// to an existing Transport yet. Cut adds to any earlier faults.
func (n *Network) Cut(from, to string) {
	n.mu.Lock()
	n.cuts[link{from, to}] = struct{}{}
	n.mu.Unlock()
}

// Isolate cuts node name off from every other node of the Network in both
// directions, until Heal.
func (n *Network) Isolate(name string) {
	n.mu.Lock()
	n.isolated[name] = struct{}{}
	n.mu.Unlock()
}

// Mute drops every packet node name sends, until Heal, while its streams
// (push/pull, joins) pass both ways and it still receives packets: its
// gossip never leaves it, as when a node's gossip is too slow to matter.
func (n *Network) Mute(name string) {
	n.mu.Lock()
	n.muted[name] = struct{}{}
	n.mu.Unlock()
}

// Drop makes the Network drop the given fraction of all packets, chosen at
// random by the Network's source when each packet is sent. Streams are not
// affected. A fraction outside [0, 1] (or NaN) is an error and changes
// nothing.
func (n *Network) Drop(fraction float64) error {
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return fmt.Errorf("%w: drop fraction %v is not within [0, 1]", ErrInvalid, fraction)
	}
	n.mu.Lock()
	n.drop = fraction
	n.mu.Unlock()
	return nil
}

// Delay makes every packet reach its receiver d after it arrived, without
// blocking the sender. The delay is fixed when the packet arrives; packets
// already waiting keep theirs. Streams are not delayed. Delay(0) removes
// the delay; a negative d is an error and changes nothing.
func (n *Network) Delay(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: negative delay %v", ErrInvalid, d)
	}
	n.mu.Lock()
	n.delay = d
	n.mu.Unlock()
	return nil
}

// Heal removes every fault: partition, cuts, isolations, mutes, drops and
// delay.
// Packets already waiting out a delay are still delivered late. Heal does
// not reconnect memberlist: a node that was declared dead stays dead until
// someone joins it again.
func (n *Network) Heal() {
	n.mu.Lock()
	n.groups = make(map[string]int)
	n.cuts = make(map[link]struct{})
	n.isolated = make(map[string]struct{})
	n.muted = make(map[string]struct{})
	n.drop = 0
	n.delay = 0
	n.mu.Unlock()
}

// Stats returns the number of packets sent through the Network's
// Transports and the number of packets dropped (by a fault on the sending
// or the receiving side, or because a receiver already held its maximum of
// 4096 undelivered packets), both since New. Refused stream dials are not
// counted.
func (n *Network) Stats() (sent, dropped uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent, n.dropped
}

// Addr returns the "host:port" address of the newest live Transport of the
// named node, and false when the node has none.
func (n *Network) Addr(name string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.byName[name]
	if !ok {
		return "", false
	}
	return t.addr.String(), true
}

// register records t's address and makes t the newest Transport of its
// name, replacing an older one's entry in byName.
func (n *Network) register(t *Transport) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.byAddr[t.addr] = t
	n.byName[t.name] = t
}

// unregister forgets t, unless a newer Transport has taken its place.
func (n *Network) unregister(t *Transport) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byAddr[t.addr] == t {
		delete(n.byAddr, t.addr)
	}
	if n.byName[t.name] == t {
		delete(n.byName, t.name)
	}
}

// linkDownLocked reports whether the current faults stop packets from node
// from to node to. An empty name is an unknown endpoint.
func (n *Network) linkDownLocked(from, to string) bool {
	if from == "" || to == "" || from == to {
		return false
	}
	if _, ok := n.isolated[from]; ok {
		return true
	}
	if _, ok := n.isolated[to]; ok {
		return true
	}
	if _, ok := n.cuts[link{from, to}]; ok {
		return true
	}
	gf, okf := n.groups[from]
	gt, okt := n.groups[to]
	return okf && okt && gf != gt
}

// nameLocked returns the name of the node bound at addr, or "".
func (n *Network) nameLocked(addr netip.AddrPort) string {
	if t, ok := n.byAddr[addr]; ok {
		return t.name
	}
	return ""
}

// sendPacket counts a packet from node from to address to and reports
// whether the sender should put it on the wire.
func (n *Network) sendPacket(from, to string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sent++
	toName := ""
	if key, ok := parseAddr(to); ok {
		toName = n.nameLocked(key)
	}
	_, muted := n.muted[from]
	if muted || n.linkDownLocked(from, toName) || (n.drop > 0 && n.rng.Float64() < n.drop) {
		n.dropped++
		return false
	}
	return true
}

// deliverPacket reports whether a packet from address from may be handed
// to node to now, and counts it as dropped if not.
func (n *Network) deliverPacket(from net.Addr, to string) bool {
	key, ok := netAddrKey(from)
	if !ok {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.linkDownLocked(n.nameLocked(key), to) {
		n.dropped++
		return false
	}
	return true
}

// dropOverflow counts a packet dropped because a receiver's queue is full.
func (n *Network) dropOverflow() {
	n.mu.Lock()
	n.dropped++
	n.mu.Unlock()
}

// packetDelay returns the current delay.
func (n *Network) packetDelay() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.delay
}

// dialCheck returns a *net.OpError wrapping ErrLinkDown when node from may
// not open a stream to address to, and nil otherwise.
func (n *Network) dialCheck(from, to string) error {
	key, ok := parseAddr(to)
	if !ok {
		return nil
	}
	n.mu.Lock()
	toName := n.nameLocked(key)
	down := n.linkDownLocked(from, toName) || n.linkDownLocked(toName, from)
	n.mu.Unlock()
	if !down {
		return nil
	}
	return &net.OpError{
		Op:   "dial",
		Net:  "tcp",
		Addr: net.TCPAddrFromAddrPort(key),
		Err:  fmt.Errorf("%w between %q and %q", ErrLinkDown, from, toName),
	}
}

// acceptStream reports whether a stream from remote address remote may
// reach node to. Streams from dialers outside the Network pass.
func (n *Network) acceptStream(remote net.Addr, to string) bool {
	key, ok := netAddrKey(remote)
	if !ok {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	from := n.dialers[key]
	return !n.linkDownLocked(from, to) && !n.linkDownLocked(to, from)
}

// trackDialer records that local is the local address of a stream dialed
// by node from, and returns the function that forgets it.
func (n *Network) trackDialer(local net.Addr, from string) func() {
	key, ok := netAddrKey(local)
	if !ok {
		return func() {}
	}
	n.mu.Lock()
	n.dialers[key] = from
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		if n.dialers[key] == from {
			delete(n.dialers, key)
		}
		n.mu.Unlock()
	}
}

// parseAddr parses an "ip:port" string into the canonical form used as a
// map key. Host names are not resolved: they are unknown endpoints.
func parseAddr(s string) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// netAddrKey returns the canonical map key of a UDP or TCP address.
func netAddrKey(a net.Addr) (netip.AddrPort, bool) {
	var ap netip.AddrPort
	switch v := a.(type) {
	case *net.UDPAddr:
		if v == nil {
			return netip.AddrPort{}, false
		}
		ap = v.AddrPort()
	case *net.TCPAddr:
		if v == nil {
			return netip.AddrPort{}, false
		}
		ap = v.AddrPort()
	case nil:
		return netip.AddrPort{}, false
	default:
		return parseAddr(a.String())
	}
	if !ap.IsValid() {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}
