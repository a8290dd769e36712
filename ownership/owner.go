package ownership

import (
	"errors"
	"fmt"
)

// Who owns what, as a node of the cluster sees it: the vocabulary shared by
// the coordinator, which answers, and the transports and resources, which
// ask or pass the answer on. It lives here, beside the tokens, so a resource
// server that only checks tokens imports none of the coordinator's
// machinery.
var (
	// ErrNoOwner: the ring has no owner for the key yet (no members).
	ErrNoOwner = errors.New("tenure: no owner")
	// ErrNotOwner: this node does not hold the key's partition. The
	// returned error is a *NotOwnerError naming the owner.
	ErrNotOwner = errors.New("tenure: not the owner")
)

// OwnerInfo describes the owner of a partition as one node sees it.
type OwnerInfo struct {
	Partition uint32 `json:"partition"`
	// Node is the member the ring assigns the partition to.
	Node string `json:"node"`
	// Addr is that member's ServiceAddr ("" if it gossiped none).
	Addr string `json:"addr,omitempty"`
	// Token is the owner's current grant if gossip has shown it, else the
	// zero token (a handoff is in progress).
	Token Token `json:"-"`
}

// NotOwnerError says which node owns a key this node was asked about.
// errors.Is(err, ErrNotOwner) holds.
type NotOwnerError struct {
	Owner OwnerInfo
}

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("tenure: partition %d is owned by %q at %q", e.Owner.Partition, e.Owner.Node, e.Owner.Addr)
}

// Is makes errors.Is(err, ErrNotOwner) true.
func (e *NotOwnerError) Is(target error) bool { return target == ErrNotOwner }

// Member is a node of the cluster as gossip sees it.
type Member struct {
	Name        string `json:"name"`
	GossipAddr  string `json:"gossip_addr"`
	ServiceAddr string `json:"service_addr,omitempty"`
	Incarnation uint64 `json:"incarnation"`
}
