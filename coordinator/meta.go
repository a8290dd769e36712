package coordinator

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
)

// metaVersion is the version of the node metadata encoding. Version 3
// added the MAC.
const metaVersion = 3

// metaPurpose is what the MAC of node metadata authenticates.
const metaPurpose = "node metadata"

// Metadata flags.
const (
	metaLeaving = 1 << 0
	metaMAC     = 1 << 1 // a MAC ends the metadata
	// metaGone: the goodbye, published once the handoff is done, just
	// before memberlist's leave: a drop counts as graceful only where it
	// was heard. (A node of an older release refuses the update with this
	// flag, keeps the metadata before it, which says Leaving, and counts
	// the drop as graceful by its old rule; mixed releases do not share
	// gossip anyway, its encoding version changed with this one.)
	metaGone = 1 << 2
)

// maxMeta is memberlist's limit on node metadata.
const maxMeta = 512

// errBadMeta wraps every metadata decoding failure. Metadata that fails
// authentication wraps ownership.ErrBadMAC too.
var errBadMeta = errors.New("coordinator: malformed node metadata")

// meta is what a node gossips about itself in memberlist's NodeMeta.
type meta struct {
	Cluster     string // cluster name: other clusters are refused
	RingVersion string // ring.AlgorithmVersion: mixed rings are refused
	Incarnation uint64 // random per process start
	ServiceAddr string // the application's endpoint
	// Stable names the stable membership the node holds, so that a node
	// whose own is older learns it is outdated from the member list alone.
	Stable quorum.StableID
	// Leaving: the node is handing its partitions off; it places nothing.
	Leaving bool
	// Gone: the goodbye. The handoff is over and the node leaves the
	// membership now. A member that heard it counts the node's drop as a
	// graceful leave; one that saw only Leaving counts it as a crash, for
	// a split may have cut it off from the leaver (issue 19, defect 4).
	// memberlist orders metadata by its own incarnation: an older alive
	// message heard later does not undo it.
	Gone bool
}

// encode returns the metadata bytes of node name: a version byte, a flags
// byte (bit 0: leaving; bit 1: a MAC follows; bit 2: gone), the incarnation, the stable
// version and hash as uvarints, then three uvarint-length-prefixed
// strings, and when keys is not nil a MAC under keys of the node's name
// (uvarint-length-prefixed) followed by every byte before the MAC. The
// MAC binds the metadata to the name: a node can't advertise another's.
// It does not prove freshness: a replay of a node's earlier metadata
// under its name is stopped only by encrypted gossip (GossipKeys).
func (m meta) encode(name string, keys *ownership.Keyring) ([]byte, error) {
	b := make([]byte, 0, 48+ownership.MACSize+len(m.Cluster)+len(m.RingVersion)+len(m.ServiceAddr))
	var flags byte
	if m.Leaving {
		flags |= metaLeaving
	}
	if m.Gone {
		flags |= metaGone
	}
	if keys != nil {
		flags |= metaMAC
	}
	b = append(b, metaVersion, flags)
	b = binary.AppendUvarint(b, m.Incarnation)
	b = binary.AppendUvarint(b, m.Stable.Version)
	b = binary.AppendUvarint(b, m.Stable.Hash)
	for _, s := range []string{m.Cluster, m.RingVersion, m.ServiceAddr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if keys != nil {
		mac := keys.Authenticate(metaPurpose, metaSigned(name, b))
		b = append(b, mac[:]...)
	}
	if len(b) > maxMeta {
		return nil, fmt.Errorf("coordinator: node metadata is %d bytes, memberlist allows %d", len(b), maxMeta)
	}
	return b, nil
}

// metaSigned is what the MAC of name's metadata body covers.
func metaSigned(name string, body []byte) []byte {
	out := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(name)+len(body)), uint64(len(name)))
	out = append(out, name...)
	return append(out, body...)
}

// decodeMeta parses the metadata of node name from the network; it never
// panics. With keys set, metadata without a MAC that verifies under keys
// for name is refused (an error wrapping errBadMeta and
// ownership.ErrBadMAC). Without keys a MAC is accepted unchecked.
func decodeMeta(b []byte, name string, keys *ownership.Keyring) (meta, error) {
	var m meta
	if len(b) == 0 {
		return m, fmt.Errorf("%w: empty", errBadMeta)
	}
	if len(b) > maxMeta {
		return m, fmt.Errorf("%w: %d bytes", errBadMeta, len(b))
	}
	if b[0] != metaVersion {
		return m, fmt.Errorf("%w: version %d, want %d", errBadMeta, b[0], metaVersion)
	}
	if len(b) < 2 || b[1]&^(metaLeaving|metaMAC|metaGone) != 0 {
		return m, fmt.Errorf("%w: flags", errBadMeta)
	}
	m.Leaving, m.Gone = b[1]&metaLeaving != 0, b[1]&metaGone != 0
	signed := b[1]&metaMAC != 0
	all := b
	if signed {
		if len(b) < 2+ownership.MACSize {
			return meta{}, fmt.Errorf("%w: truncated MAC", errBadMeta)
		}
		b = b[:len(b)-ownership.MACSize]
	}
	if keys != nil {
		if !signed {
			return meta{}, fmt.Errorf("%w: %w: node %q sent unsigned metadata", errBadMeta, ownership.ErrBadMAC, name)
		}
		if !keys.Authentic(metaPurpose, metaSigned(name, b), all[len(b):]) {
			return meta{}, fmt.Errorf("%w: %w: metadata of node %q", errBadMeta, ownership.ErrBadMAC, name)
		}
	}
	b = b[2:]
	for _, dst := range []*uint64{&m.Incarnation, &m.Stable.Version, &m.Stable.Hash} {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return meta{}, fmt.Errorf("%w: truncated number", errBadMeta)
		}
		*dst = v
		b = b[n:]
	}
	for _, dst := range []*string{&m.Cluster, &m.RingVersion, &m.ServiceAddr} {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return meta{}, fmt.Errorf("%w: truncated string", errBadMeta)
		}
		*dst = string(b[n : n+int(l)])
		b = b[n+int(l):]
	}
	if len(b) != 0 {
		return meta{}, fmt.Errorf("%w: %d trailing bytes", errBadMeta, len(b))
	}
	return m, nil
}

// goodbyeMagic opens a goodbye sent over a stream: a byte no gossip
// message starts with (gossip's is 0x67).
const goodbyeMagic = 0x62

// encodeGoodbye returns the goodbye of node name, sent to each live member
// over a stream: the magic byte, the name (uvarint-length-prefixed) and
// the node's metadata, which says Gone and carries its MAC.
func encodeGoodbye(name string, md []byte) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(name)+len(md))
	b = append(b, goodbyeMagic)
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	return append(b, md...)
}

// decodeGoodbye parses a goodbye from the network; it never panics. The
// metadata must decode (and, with keys set, verify) for the name it
// carries, and say Gone.
func decodeGoodbye(b []byte, keys *ownership.Keyring) (string, meta, error) {
	if len(b) == 0 || b[0] != goodbyeMagic {
		return "", meta{}, fmt.Errorf("%w: not a goodbye", errBadMeta)
	}
	b = b[1:]
	l, n := binary.Uvarint(b)
	if n <= 0 || l == 0 || l > quorum.MaxMemberSize || l > uint64(len(b)-n) {
		return "", meta{}, fmt.Errorf("%w: goodbye: bad name", errBadMeta)
	}
	name := string(b[n : n+int(l)])
	md, err := decodeMeta(b[n+int(l):], name, keys)
	if err != nil {
		return "", meta{}, fmt.Errorf("goodbye of %q: %w", name, err)
	}
	if !md.Gone {
		return "", meta{}, fmt.Errorf("%w: goodbye of %q does not say gone", errBadMeta, name)
	}
	return name, md, nil
}
