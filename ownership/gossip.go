package ownership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"

	"github.com/tenure-go/tenure/ownership/quorum"
)

// Gossip is input from the network: anything that can send a packet to a
// node's gossip port can offer it a message. Every message names its
// cluster and sender, and when the cluster has token keys it carries a MAC
// under them, which OpenGossip checks before anything in it is believed.
// Without keys a cluster trusts whoever can reach its gossip port (encrypt
// gossip, or set token keys). Even then a claim can't move a partition's
// epoch by more than MaxEpochJump at once, so no single message can
// exhaust an epoch and make a partition unclaimable.
//
// Every kind of message travels on one channel (GossipKind.Channel):
// claims and stable memberships are broadcasts, a node's whole state
// travels in memberlist's push/pull. OpenGossip is told the channel the
// bytes came in on and refuses every other kind before reading its body,
// and the MAC is computed under a context that names the channel, so a
// broadcast's MAC does not verify as a state's even where a caller forgot
// the kind (and the kind byte is under the MAC too).
//
// Replay. A MAC proves who made a message, not when: anyone on the path
// can copy an authentic message and send it again, on its own channel, at
// any later time (on another channel or to another cluster it fails).
// What a replay can do is bounded by the merges, which are all monotone:
//
//   - a claim heard twice: the register keeps the highest claim per
//     partition (Register.ObserveHeard), so the second copy changes
//     nothing; an older claim or release, heard after a newer one, is
//     below it and ignored;
//   - a stale stable membership heard late: a heard set replaces a node's
//     own only if its ID is higher (and plausible, and a quorum of it is
//     known), so one the node has moved past is ignored;
//   - an old state replayed: it is its stable membership and its claims,
//     each merged as above, so it can't move a node backwards either.
//
// So a replay delivers, at worst, a message the cluster once sent to a
// node that had not heard it yet: what gossip does anyway. It can't
// lower an epoch, revive a lease, or bring back a stable membership a
// node has left behind. A node that restarts has forgotten everything and
// relearns from the current members; a replayed old set it adopts then
// is superseded as in any late delivery (members' metadata shows the
// newer ID, which makes it outdated until it learns it).
//
// One case is not bounded by the merges: a cluster restarted whole with
// the same keys starts its stable versions again at 1, and a stable
// membership of its previous life, replayed, has a higher ID of which no
// quorum is known. It puts the node in doubt (no quorum) until StableAfter
// passes without hearing it, and a replay repeated more often than that
// keeps it there. Rotate the keys (or the cluster name) when a cluster is
// rebuilt from nothing, or encrypt gossip (GossipKeys) so that nobody can
// capture messages to replay.

// ErrWrongCluster: a gossip message names another cluster.
var ErrWrongCluster = errors.New("tenure: gossip from another cluster")

// MaxEpochJump is the most a heard claim may raise a partition's epoch above
// what the node knew (see Register.ObserveHeard). A cluster moves a
// partition once per ownership change: 2^32 moves is more than any real
// cluster sees, and 2^64 / 2^32 forged messages are needed to exhaust an
// epoch.
const MaxEpochJump = 1 << 32

// GossipKind says what a gossip message carries.
type GossipKind uint8

// The kinds of gossip message.
const (
	GossipClaim  GossipKind = iota + 1 // one claim or release (a broadcast)
	GossipStable                       // a stable membership (a broadcast)
	GossipState                        // a node's whole state: stable membership and register (push/pull)
)

// A GossipChannel is where a gossip message travels. Each kind has one
// (Channel), and OpenGossip opens only the kinds of the channel it is
// told the bytes came in on.
type GossipChannel uint8

// The gossip channels.
const (
	// GossipBroadcast: memberlist user messages, by UDP or TCP (the
	// delegate's GetBroadcasts and NotifyMsg): claims and stable
	// memberships.
	GossipBroadcast GossipChannel = iota + 1
	// GossipPushPull: the user state of memberlist's push/pull exchange
	// (the delegate's LocalState and MergeRemoteState): states.
	GossipPushPull
)

func (c GossipChannel) String() string {
	switch c {
	case GossipBroadcast:
		return "broadcast"
	case GossipPushPull:
		return "push/pull"
	}
	return fmt.Sprintf("GossipChannel(%d)", uint8(c))
}

// Channel returns the channel messages of kind k travel on (zero for an
// unknown kind).
func (k GossipKind) Channel() GossipChannel {
	switch k {
	case GossipClaim, GossipStable:
		return GossipBroadcast
	case GossipState:
		return GossipPushPull
	}
	return 0
}

func (k GossipKind) String() string {
	switch k {
	case GossipClaim:
		return "claim"
	case GossipStable:
		return "stable"
	case GossipState:
		return "state"
	}
	return fmt.Sprintf("GossipKind(%d)", uint8(k))
}

// A GossipMessage is one message of tenure's gossip protocol.
type GossipMessage struct {
	Kind    GossipKind
	Cluster string // the cluster name; at most 255 bytes
	Sender  string // the sending node's name; at most MaxOwnerSize bytes
	// Claim, for GossipClaim.
	Claim Claim
	// Stable, for GossipStable and GossipState (zero if the sender has none).
	Stable quorum.Stable
	// Register, for GossipState.
	Register *Register
}

// Claims returns the claims m carries: a claim message's one claim, or
// the claims of a state's register.
func (m GossipMessage) Claims() iter.Seq[Claim] {
	return func(yield func(Claim) bool) {
		switch {
		case m.Kind == GossipClaim:
			yield(m.Claim)
		case m.Kind == GossipState && m.Register != nil:
			for c := range m.Register.All() {
				if !yield(c) {
					return
				}
			}
		}
	}
}

// Gossip message encoding, version 2:
//
//	magic     1 byte, 0x67 ('g')
//	version   1 byte, 2
//	kind      1 byte (GossipKind)
//	flags     1 byte: bit 0 set when a MAC follows; other bits zero
//	cluster   1 byte length, then the name
//	sender    1 byte length, then the name
//	body      the kind's body (below)
//	MAC       MACSize bytes, when flagged: HMAC-SHA256 under the primary
//	          token key, of a context naming the kind's channel followed
//	          by every byte before the MAC, truncated
//
// Bodies: a claim is its binary encoding (see Claim.AppendBinary); a stable
// membership is a uvarint version, a uvarint count and the names (1 byte
// length, then the name), sorted and distinct, count 0 exactly when the
// version is 0; a state is a stable membership followed by the register's
// encoding (see Register.AppendBinary). Like every tenure encoding it is
// canonical: decoders reject anything else.
//
// Version 1 had the same layout but one MAC context for every channel.
// Nodes of versions 1 and 2 drop each other's gossip as malformed: a
// cluster must not mix them (the fence keeps writes safe meanwhile, but
// claims don't cross and ownership doesn't converge until every node runs
// version 2).
const (
	gossipMagic   = 0x67
	gossipVersion = 2
	gossipFlagMAC = 1 << 0
)

// Seal encodes m and, when keys is not nil, appends its MAC.
func (m GossipMessage) Seal(keys *Keyring) ([]byte, error) {
	switch {
	case len(m.Cluster) > 255:
		return nil, malformed("gossip: cluster name is %d bytes, at most 255", len(m.Cluster))
	case m.Sender == "" || len(m.Sender) > MaxOwnerSize:
		return nil, malformed("gossip: sender name is %d bytes, want 1 to %d", len(m.Sender), MaxOwnerSize)
	case m.Kind < GossipClaim || m.Kind > GossipState:
		return nil, malformed("gossip: unknown kind %d", m.Kind)
	case m.Kind != GossipClaim && !m.Stable.Valid():
		return nil, malformed("gossip: invalid stable membership %v", m.Stable)
	case m.Kind == GossipState && m.Register == nil:
		return nil, malformed("gossip: state without a register")
	}
	var flags byte
	if keys != nil {
		flags |= gossipFlagMAC
	}
	b := []byte{gossipMagic, gossipVersion, byte(m.Kind), flags, byte(len(m.Cluster))}
	b = append(b, m.Cluster...)
	b = append(b, byte(len(m.Sender)))
	b = append(b, m.Sender...)
	var err error
	switch m.Kind {
	case GossipClaim:
		b, err = m.Claim.AppendBinary(b)
	case GossipStable:
		b = appendStable(b, m.Stable)
	case GossipState:
		b = appendStable(b, m.Stable)
		b, err = m.Register.AppendBinary(b)
	}
	if err != nil {
		return nil, err
	}
	if keys != nil {
		mac := keys.sealBytes(m.Kind.Channel(), b)
		b = append(b, mac[:]...)
	}
	return b, nil
}

func appendStable(b []byte, s quorum.Stable) []byte {
	b = binary.AppendUvarint(b, s.Version)
	b = binary.AppendUvarint(b, uint64(len(s.Members)))
	for _, m := range s.Members {
		b = append(b, byte(len(m)))
		b = append(b, m...)
	}
	return b
}

// OpenGossip decodes a gossip message received from the network on channel
// ch and checks it: it must be well formed and of a kind that travels on ch
// (else an error wrapping ErrMalformedToken; the body of a kind of another
// channel is not read), name cluster (else ErrWrongCluster), and, when keys
// is not nil, carry a MAC for ch that verifies under keys, every token in
// it too (else ErrBadMAC). A message it returns without error has the
// fields of its kind set: a GossipState has a Register. It never panics.
func OpenGossip(b []byte, ch GossipChannel, cluster string, keys *Keyring) (GossipMessage, error) {
	var m GossipMessage
	d := decoder{b: b}
	magic, version := d.byte(), d.byte()
	if d.ok() && (magic != gossipMagic || version != gossipVersion) {
		return m, malformed("gossip: not a tenure gossip message (%#x %d)", magic, version)
	}
	m.Kind = GossipKind(d.byte())
	flags := d.byte()
	m.Cluster = string(d.bytes(int(d.byte())))
	m.Sender = string(d.bytes(int(d.byte())))
	switch {
	case !d.ok():
		return GossipMessage{}, d.err()
	case m.Kind < GossipClaim || m.Kind > GossipState:
		return GossipMessage{}, malformed("gossip: unknown kind %d", m.Kind)
	case m.Kind.Channel() != ch:
		return GossipMessage{}, malformed("gossip: a %v message on the %v channel", m.Kind, ch)
	case flags&^gossipFlagMAC != 0:
		return GossipMessage{}, malformed("gossip: unknown flags %#x", flags)
	case m.Sender == "":
		return GossipMessage{}, malformed("gossip: no sender")
	}
	body := d.b
	if flags&gossipFlagMAC != 0 {
		if len(body) < MACSize {
			return GossipMessage{}, malformed("gossip: truncated MAC")
		}
		body = body[:len(body)-MACSize]
	}
	if m.Cluster != cluster {
		return GossipMessage{}, fmt.Errorf("%w: %q, not %q", ErrWrongCluster, m.Cluster, cluster)
	}
	if keys != nil {
		if flags&gossipFlagMAC == 0 {
			return GossipMessage{}, fmt.Errorf("%w: unsigned gossip from %q", ErrBadMAC, m.Sender)
		}
		if !keys.openBytes(ch, b[:len(b)-MACSize], b[len(b)-MACSize:]) {
			return GossipMessage{}, fmt.Errorf("%w: gossip from %q", ErrBadMAC, m.Sender)
		}
	}
	var err error
	switch m.Kind {
	case GossipClaim:
		m.Claim, err = ParseClaim(body)
	case GossipStable:
		m.Stable, err = parseStable(body, true)
	case GossipState:
		bd := decoder{b: body}
		m.Stable = readStable(&bd)
		if err = bd.err(); err == nil {
			m.Register, err = UnmarshalRegister(bd.b)
		}
	}
	if err != nil {
		return GossipMessage{}, fmt.Errorf("gossip from %q: %w", m.Sender, err)
	}
	if keys != nil {
		if err := m.verifyTokens(keys); err != nil {
			return GossipMessage{}, err
		}
	}
	return m, nil
}

// verifyTokens checks the MAC of every token m carries.
func (m GossipMessage) verifyTokens(keys *Keyring) error {
	switch m.Kind {
	case GossipClaim:
		return keys.Verify(m.Claim.Token)
	case GossipState:
		for c := range m.Register.All() {
			if err := keys.Verify(c.Token); err != nil {
				return err
			}
		}
	}
	return nil
}

func parseStable(b []byte, whole bool) (quorum.Stable, error) {
	d := decoder{b: b}
	s := readStable(&d)
	if whole {
		if err := d.end(); err != nil {
			return quorum.Stable{}, err
		}
	}
	return s, d.err()
}

// readStable reads a stable membership's encoding.
func readStable(d *decoder) quorum.Stable {
	var s quorum.Stable
	s.Version = d.uvarint()
	n := d.uvarint()
	if !d.ok() {
		return quorum.Stable{}
	}
	if n > uint64(len(d.b))/2 {
		d.fail(faultTruncated)
		return quorum.Stable{}
	}
	for range n {
		s.Members = append(s.Members, string(d.bytes(int(d.byte()))))
	}
	if d.ok() && !s.Valid() {
		d.fail(faultInvalid)
		return quorum.Stable{}
	}
	return s
}

// ObserveHeard is ObserveClaim for a claim heard from the network: it also
// refuses (with an error wrapping ErrMalformedToken) a claim that would
// raise the partition's epoch by more than MaxEpochJump above what r holds.
func (r *Register) ObserveHeard(c Claim) (bool, error) {
	if !r.valid(c) {
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.claims[c.Token.Partition].Token.Epoch; c.Token.Epoch > cur && c.Token.Epoch-cur > MaxEpochJump {
		return false, malformed("claim %v jumps %d epochs above %d", c.Token, c.Token.Epoch-cur, cur)
	}
	return r.observe(c), nil
}
