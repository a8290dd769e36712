package coordinator

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
)

// metaVersion is the version of the node metadata encoding.
const metaVersion = 2

// maxMeta is memberlist's limit on node metadata.
const maxMeta = 512

// errBadMeta wraps every metadata decoding failure.
var errBadMeta = errors.New("coordinator: malformed node metadata")

// meta is what a node gossips about itself in memberlist's NodeMeta.
type meta struct {
	Cluster     string // cluster name: other clusters are refused
	RingVersion string // ring.AlgorithmVersion: mixed rings are refused
	Incarnation uint64 // random per process start
	ServiceAddr string // the application's endpoint
	// Stable names the stable membership the node holds, so that a node
	// whose own is older learns it is outdated from the member list alone.
	Stable ownership.StableID
	// Leaving: the node is handing its partitions off; it places nothing.
	Leaving bool
}

// encode returns the metadata bytes: a version byte, a flags byte (bit 0:
// leaving), the incarnation, the stable version and hash as uvarints, then
// three uvarint-length-prefixed strings.
func (m meta) encode() ([]byte, error) {
	b := make([]byte, 0, 48+len(m.Cluster)+len(m.RingVersion)+len(m.ServiceAddr))
	var flags byte
	if m.Leaving {
		flags |= 1
	}
	b = append(b, metaVersion, flags)
	b = binary.AppendUvarint(b, m.Incarnation)
	b = binary.AppendUvarint(b, m.Stable.Version)
	b = binary.AppendUvarint(b, m.Stable.Hash)
	for _, s := range []string{m.Cluster, m.RingVersion, m.ServiceAddr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if len(b) > maxMeta {
		return nil, fmt.Errorf("coordinator: node metadata is %d bytes, memberlist allows %d", len(b), maxMeta)
	}
	return b, nil
}

// decodeMeta parses metadata from the network; it never panics.
func decodeMeta(b []byte) (meta, error) {
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
	if len(b) < 2 || b[1]&^1 != 0 {
		return m, fmt.Errorf("%w: flags", errBadMeta)
	}
	m.Leaving = b[1]&1 != 0
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
