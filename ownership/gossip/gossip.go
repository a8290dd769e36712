package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/internal/wire"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// Gossip is input from the network: anything that can send a packet to a
// node's gossip port can offer it a message. Every message names its
// cluster and sender, and when the cluster has token keys it carries a MAC
// under them, which Open checks before anything in it is believed.
// Without keys a cluster trusts whoever can reach its gossip port (encrypt
// gossip, or set token keys). Even then a claim can't move a partition's
// epoch by more than MaxEpochJump at once, so no single message can
// exhaust an epoch and make a partition unclaimable.
//
// Every kind of message travels on one channel (Kind.Channel):
// claims, stable memberships and sections of a register are memberlist
// user messages (broadcast, or sent to one member), a node's state (whole
// at a join, else its register's digest) travels in memberlist's
// push/pull. Open is told the channel the
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
//     each merged as above, so it can't move a node backwards either;
//   - a digest or a section replayed: a section's claims merge as above;
//     a stale digest, or a section that asks, makes the node send the
//     member it names the claims it holds in some ranges, which that
//     member merges as above. The node sends at most one section message
//     at a time, from a queue of a few, and never to anyone but a current
//     member; and it answers a member's ask only for ranges in which that
//     member's digest, merged within about a push/pull interval (clamped
//     to 1-30 s), differed from its own, each range once
//     (coordinator/exchange.go). So a replayed ask alone is answered by
//     nothing, and replays of digests and asks together earn at most one
//     register's worth of answers per member per half of that interval.
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
var ErrWrongCluster = errors.New("gossip: gossip from another cluster")

// MaxEpochJump is the most a heard claim may raise a partition's epoch above
// what the node knew (see Register.ObserveHeard). A cluster moves a
// partition once per ownership change: 2^32 moves is more than any real
// cluster sees, and 2^64 / 2^32 forged messages are needed to exhaust an
// epoch.
const MaxEpochJump = 1 << 32

// Kind says what a gossip message carries.
type Kind uint8

// The kinds of gossip message.
const (
	KindClaim     Kind = iota + 1 // one claim or release (a broadcast)
	KindStable                    // a stable membership (a broadcast)
	KindState                     // a node's whole state: stable membership and register (push/pull)
	KindDigest                    // a node's state by digest: stable membership and register digest (push/pull)
	KindSection                   // claims of some ranges of a register's digest (broadcast channel, sent to one member)
	KindAskStable                 // the sender's stable membership, asking for the receiver's (broadcast channel, sent to one member)

	kindLast = KindAskStable
)

// A Channel is where a gossip message travels. Each kind has one
// (Channel), and Open opens only the kinds of the channel it is
// told the bytes came in on.
type Channel uint8

// The gossip channels.
const (
	// Broadcast: memberlist user messages, by UDP or TCP (the
	// delegate's GetBroadcasts and NotifyMsg, and memberlist's
	// SendReliable to one member): claims, stable memberships and
	// sections of a register.
	Broadcast Channel = iota + 1
	// PushPull: the user state of memberlist's push/pull exchange
	// (the delegate's LocalState and MergeRemoteState): states, whole
	// or by digest.
	PushPull
)

func (c Channel) String() string {
	switch c {
	case Broadcast:
		return "broadcast"
	case PushPull:
		return "push/pull"
	}
	return fmt.Sprintf("Channel(%d)", uint8(c))
}

// Channel returns the channel messages of kind k travel on (zero for an
// unknown kind).
func (k Kind) Channel() Channel {
	switch k {
	case KindClaim, KindStable, KindSection, KindAskStable:
		return Broadcast
	case KindState, KindDigest:
		return PushPull
	}
	return 0
}

func (k Kind) String() string {
	switch k {
	case KindClaim:
		return "claim"
	case KindStable:
		return "stable"
	case KindState:
		return "state"
	case KindDigest:
		return "digest"
	case KindSection:
		return "section"
	case KindAskStable:
		return "ask-stable"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// A Message is one message of tenure's gossip protocol.
type Message struct {
	Kind    Kind
	Cluster string // the cluster name; at most 255 bytes
	Sender  string // the sending node's name; at most MaxOwnerSize bytes
	// Claim, for KindClaim.
	Claim Claim
	// Stable, for KindStable, KindState, KindDigest and KindAskStable
	// (zero if the sender has none).
	Stable quorum.Stable
	// Register, for KindState.
	Register *Register
	// Digest, for KindDigest: the digest of the sender's register.
	Digest Digest
	// Section, for KindSection.
	Section Section
	// Unverified, set by Open, counts the claims of a state or section
	// it dropped because their tokens' MACs did not verify under the
	// keys (a claim signed under a key this node no longer holds, in a
	// key rotation, or a forgery). Seal ignores it.
	Unverified int
}

// Claims returns the claims m carries: a claim message's one claim, the
// claims of a state's register, or a section's claims.
func (m Message) Claims() iter.Seq[Claim] {
	return func(yield func(Claim) bool) {
		switch {
		case m.Kind == KindClaim:
			yield(m.Claim)
		case m.Kind == KindState && m.Register != nil:
			for c := range m.Register.All() {
				if !yield(c) {
					return
				}
			}
		case m.Kind == KindSection:
			for _, c := range m.Section.Claims {
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
//	kind      1 byte (Kind)
//	flags     1 byte: bit 0 set when a MAC follows; other bits zero
//	cluster   1 byte length, then the name
//	sender    1 byte length, then the name
//	body      the kind's body (below)
//	MAC       MACSize bytes, when flagged: HMAC-SHA256 under the primary
//	          token key, of a context naming the kind's channel followed
//	          by every byte before the MAC, truncated
//
// Bodies: a claim is its binary encoding (see Claim.AppendBinary); a stable
// membership, and an ask for one, is a uvarint version, a uvarint count and the names (1 byte
// length, then the name), sorted and distinct, count 0 exactly when the
// version is 0; a state is a stable membership followed by the register's
// encoding (see Register.AppendBinary); a digest is a stable membership,
// a uvarint partition count (1 to MaxPartitions) and Ranges(partitions)
// hashes of 8 bytes each, big-endian; a section is 1 byte of flags (bit 0:
// Ask; other bits zero), a uvarint partition count, a uvarint count of
// ranges (1 to Ranges(partitions)), each range as a uvarint gap (the range
// minus the previous one plus one; the first range), and its claims in the
// register encoding (of the same partition count, each claim in one of
// the ranges). Like every tenure encoding it is canonical: decoders
// reject anything else.
//
// Kinds digest and section were added in version 2 without changing the
// others, and ask-stable later in version 2 (its body is the asker's own
// stable membership): a node that does not know them drops them as of an
// unknown kind (and its own states, whole, are still understood).
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
func (m Message) Seal(keys *ownership.Keyring) ([]byte, error) {
	switch {
	case len(m.Cluster) > 255:
		return nil, wire.Malformed("gossip: cluster name is %d bytes, at most 255", len(m.Cluster))
	case m.Sender == "" || len(m.Sender) > ownership.MaxOwnerSize:
		return nil, wire.Malformed("gossip: sender name is %d bytes, want 1 to %d", len(m.Sender), ownership.MaxOwnerSize)
	case m.Kind < KindClaim || m.Kind > kindLast:
		return nil, wire.Malformed("gossip: unknown kind %d", m.Kind)
	case m.Kind != KindClaim && m.Kind != KindSection && !m.Stable.Valid():
		return nil, wire.Malformed("gossip: invalid stable membership %v", m.Stable)
	case m.Kind == KindState && m.Register == nil:
		return nil, wire.Malformed("gossip: state without a register")
	case m.Kind == KindDigest && (Ranges(m.Digest.Partitions) == 0 || len(m.Digest.Hashes) != Ranges(m.Digest.Partitions)):
		return nil, wire.Malformed("gossip: digest of %d hashes for %d partitions", len(m.Digest.Hashes), m.Digest.Partitions)
	}
	if m.Kind == KindSection {
		if err := m.Section.Validate(); err != nil {
			return nil, wire.Malformed("%v", err)
		}
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
	case KindClaim:
		b, err = m.Claim.AppendBinary(b)
	case KindStable, KindAskStable:
		b = appendStable(b, m.Stable)
	case KindState:
		b = appendStable(b, m.Stable)
		b, err = m.Register.AppendBinary(b)
	case KindDigest:
		b = appendStable(b, m.Stable)
		b = appendDigest(b, m.Digest)
	case KindSection:
		b = appendSection(b, m.Section)
	}
	if err != nil {
		return nil, err
	}
	if keys != nil {
		mac := keys.MAC(macContext(m.Kind.Channel()), b)
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

// Open decodes a gossip message received from the network on channel
// ch and checks it: it must be well formed and of a kind that travels on ch
// (else an error wrapping ErrMalformedToken; the body of a kind of another
// channel is not read), name cluster (else ErrWrongCluster), and, when keys
// is not nil, carry a MAC for ch that verifies under keys (else ErrBadMAC).
// So must a claim message's token; a claim of a state or a section whose
// token does not verify is dropped from it and counted in
// Message.Unverified, and the rest of the message is kept. A message it
// returns without error has the fields of its kind set: a KindState has a
// Register. It never panics.
//
// Open takes a state, digest or section of any partition count, and a
// state's Register is as large as its sender says (up to MaxPartitions,
// 64 bytes each): a node opens its gossip with an Opener of its own
// partition count, which refuses another before allocating for it.
func Open(b []byte, ch Channel, cluster string, keys *ownership.Keyring) (Message, error) {
	return Opener{Cluster: cluster, Keys: keys}.Open(b, ch)
}

// An Opener opens the gossip one node receives: see Open.
type Opener struct {
	Cluster string // the node's cluster name
	// Keys are the cluster's token keys. Nil checks no MAC at all: only
	// for a cluster that has no keys, where anyone who can send to a node
	// can claim (an Opener of a keyed cluster must have them).
	Keys *ownership.Keyring
	// Partitions is the node's partition count. A state, digest or
	// section of another count is refused (an error wrapping
	// ownership.ErrPartitionRange) as soon as the count is read, before
	// anything sized by it is allocated. Zero takes any count.
	Partitions int
}

// Open decodes and checks b, received on channel ch, as Open does, and
// refuses a state, digest or section of a partition count other than
// o.Partitions (when set).
func (o Opener) Open(b []byte, ch Channel) (Message, error) {
	cluster, keys := o.Cluster, o.Keys
	var m Message
	d := wire.Decoder{B: b}
	magic, version := d.Byte(), d.Byte()
	if d.OK() && (magic != gossipMagic || version != gossipVersion) {
		return m, wire.Malformed("gossip: not a tenure gossip message (%#x %d)", magic, version)
	}
	m.Kind = Kind(d.Byte())
	flags := d.Byte()
	m.Cluster = string(d.Bytes(int(d.Byte())))
	m.Sender = string(d.Bytes(int(d.Byte())))
	switch {
	case !d.OK():
		return Message{}, d.Err()
	case m.Kind < KindClaim || m.Kind > kindLast:
		return Message{}, wire.Malformed("gossip: unknown kind %d", m.Kind)
	case m.Kind.Channel() != ch:
		return Message{}, wire.Malformed("gossip: a %v message on the %v channel", m.Kind, ch)
	case flags&^gossipFlagMAC != 0:
		return Message{}, wire.Malformed("gossip: unknown flags %#x", flags)
	case m.Sender == "":
		return Message{}, wire.Malformed("gossip: no sender")
	}
	body := d.B
	if flags&gossipFlagMAC != 0 {
		if len(body) < ownership.MACSize {
			return Message{}, wire.Malformed("gossip: truncated MAC")
		}
		body = body[:len(body)-ownership.MACSize]
	}
	if m.Cluster != cluster {
		return Message{}, fmt.Errorf("%w: %q, not %q", ErrWrongCluster, m.Cluster, cluster)
	}
	if keys != nil {
		if flags&gossipFlagMAC == 0 {
			return Message{}, fmt.Errorf("%w: unsigned gossip from %q", ownership.ErrBadMAC, m.Sender)
		}
		if !keys.VerifyMAC(macContext(ch), b[:len(b)-ownership.MACSize], b[len(b)-ownership.MACSize:]) {
			return Message{}, fmt.Errorf("%w: gossip from %q", ownership.ErrBadMAC, m.Sender)
		}
	}
	var err error
	switch m.Kind {
	case KindClaim:
		m.Claim, err = ParseClaim(body)
		if err == nil && keys != nil {
			err = keys.Verify(m.Claim.Token)
		}
	case KindStable, KindAskStable:
		m.Stable, err = parseStable(body, true)
	case KindState:
		bd := wire.Decoder{B: body}
		m.Stable = readStable(&bd)
		if err = bd.Err(); err == nil {
			var parts int
			var claims []Claim
			if parts, claims, err = readClaims(bd.B, o.Partitions); err == nil {
				claims, m.Unverified = verified(claims, keys)
				m.Register = registerOf(parts, claims)
			}
		}
	case KindDigest:
		bd := wire.Decoder{B: body}
		m.Stable = readStable(&bd)
		if m.Digest, err = readDigest(&bd, o.Partitions); err == nil {
			err = bd.End()
		}
	case KindSection:
		if m.Section, err = parseSection(body, o.Partitions); err == nil {
			m.Section.Claims, m.Unverified = verified(m.Section.Claims, keys)
		}
	}
	if err != nil {
		return Message{}, fmt.Errorf("gossip from %q: %w", m.Sender, err)
	}
	return m, nil
}

// verified returns the claims whose tokens verify under keys (all of
// them when keys is nil), in place, and how many it dropped.
func verified(claims []Claim, keys *ownership.Keyring) ([]Claim, int) {
	if keys == nil {
		return claims, 0
	}
	n := len(claims)
	claims = slices.DeleteFunc(claims, func(c Claim) bool { return keys.Verify(c.Token) != nil })
	return claims, n - len(claims)
}

func parseStable(b []byte, whole bool) (quorum.Stable, error) {
	d := wire.Decoder{B: b}
	s := readStable(&d)
	if whole {
		if err := d.End(); err != nil {
			return quorum.Stable{}, err
		}
	}
	return s, d.Err()
}

// readStable reads a stable membership's encoding.
func readStable(d *wire.Decoder) quorum.Stable {
	var s quorum.Stable
	s.Version = d.Uvarint()
	n := d.Uvarint()
	if !d.OK() {
		return quorum.Stable{}
	}
	if n > uint64(len(d.B))/2 {
		d.Fail(wire.FaultTruncated)
		return quorum.Stable{}
	}
	for range n {
		s.Members = append(s.Members, string(d.Bytes(int(d.Byte()))))
	}
	if d.OK() && !s.Valid() {
		d.Fail(wire.FaultInvalid)
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
		return false, wire.Malformed("claim %v jumps %d epochs above %d", c.Token, c.Token.Epoch-cur, cur)
	}
	return r.observe(c), nil
}

// macContext returns the context of gossip MACs on channel ch
// (Keyring.MAC): it separates them from token MACs, and the channels from
// each other, so a broadcast's MAC does not verify as push/pull state.
func macContext(ch Channel) string {
	switch ch {
	case Broadcast:
		return "tenure gossip v2 broadcast mac\x00"
	case PushPull:
		return "tenure gossip v2 push/pull mac\x00"
	}
	return "tenure gossip v2 no channel\x00"
}

func appendDigest(b []byte, d Digest) []byte {
	b = binary.AppendUvarint(b, uint64(d.Partitions))
	for _, h := range d.Hashes {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return b
}

// readDigest reads a digest's encoding, of want partitions if want is
// not zero: another count is an error wrapping ErrPartitionRange, read
// before the hashes. Other faults are d's.
func readDigest(d *wire.Decoder, want int) (Digest, error) {
	parts := d.Uvarint()
	if !d.OK() {
		return Digest{}, nil
	}
	if parts < 1 || parts > MaxPartitions {
		d.Fail(wire.FaultInvalid)
		return Digest{}, nil
	}
	if want != 0 && parts != uint64(want) {
		return Digest{}, partitionCount("digest", parts, want)
	}
	dg := Digest{Partitions: int(parts), Hashes: make([]uint64, Ranges(int(parts)))}
	for i := range dg.Hashes {
		b := d.Bytes(8)
		if !d.OK() {
			return Digest{}, nil
		}
		dg.Hashes[i] = binary.BigEndian.Uint64(b)
	}
	return dg, nil
}

const sectionAsk = 1 << 0

func appendSection(b []byte, s Section) []byte {
	var flags byte
	if s.Ask {
		flags |= sectionAsk
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(s.Partitions))
	b = binary.AppendUvarint(b, uint64(len(s.Ranges)))
	next := 0
	for _, r := range s.Ranges {
		b = binary.AppendUvarint(b, uint64(r-next))
		next = r + 1
	}
	return appendClaims(b, s.Partitions, s.Claims)
}

// partitionCount is the error of a message of parts partitions to a node
// of want.
func partitionCount(what string, parts uint64, want int) error {
	return fmt.Errorf("%w: %s of %d partitions, want %d", ownership.ErrPartitionRange, what, parts, want)
}

// parseSection decodes a section's body, of want partitions if want is
// not zero (else an error wrapping ErrPartitionRange).
func parseSection(b []byte, want int) (Section, error) {
	d := wire.Decoder{B: b}
	flags := d.Byte()
	parts := d.Uvarint()
	nr := d.Uvarint()
	switch {
	case !d.OK():
		return Section{}, d.Err()
	case flags&^sectionAsk != 0:
		return Section{}, wire.Malformed("section: unknown flags %#x", flags)
	case parts < 1 || parts > MaxPartitions:
		return Section{}, wire.Malformed("section: %d partitions", parts)
	case want != 0 && parts != uint64(want):
		return Section{}, partitionCount("section", parts, want)
	case nr < 1 || nr > uint64(Ranges(int(parts))):
		return Section{}, wire.Malformed("section: %d ranges", nr)
	}
	s := Section{Partitions: int(parts), Ask: flags&sectionAsk != 0, Ranges: make([]int, 0, nr)}
	next := uint64(0)
	for range nr {
		r := next + min(d.Uvarint(), parts) // no wrap-around: both are small
		if !d.OK() {
			return Section{}, d.Err()
		}
		if r >= uint64(Ranges(int(parts))) {
			return Section{}, wire.Malformed("section: range %d of %d", r, Ranges(int(parts)))
		}
		s.Ranges = append(s.Ranges, int(r))
		next = r + 1
	}
	rp, claims, err := readClaims(d.B, 0)
	if err != nil {
		return Section{}, err
	}
	if rp != s.Partitions {
		return Section{}, wire.Malformed("section: claims of %d partitions, section of %d", rp, s.Partitions)
	}
	s.Claims = claims
	if err := s.Validate(); err != nil {
		return Section{}, wire.Malformed("section: %v", err)
	}
	return s, nil
}
