package ownership

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
)

// Node identifies one process of the cluster: a stable name and an
// incarnation drawn at random each time the process starts, so a restarted
// node never reuses a token of its previous life.
type Node struct {
	Name        string
	Incarnation uint64
}

func (n Node) String() string { return fmt.Sprintf("%s/%016x", n.Name, n.Incarnation) }

// MACSize is the length of a token's authentication code in bytes.
const MACSize = 16

// A Token is a fencing token: the right of one owner, in one epoch, to
// write to one partition. Tokens of a partition are totally ordered by
// (Epoch, Owner, Incarnation); a fenced resource rejects any token lower than
// the highest it has accepted.
//
// Token is a comparable value type; the zero Token is below every token
// minted by an authority (epochs start at 1).
type Token struct {
	Partition   uint32
	Epoch       uint64
	Owner       string
	Incarnation uint64
	// MAC authenticates the other fields under a cluster key (see Key). It is
	// all zero for an unauthenticated token and is ignored by Compare.
	MAC [MACSize]byte
}

// Node returns the owner of the token.
func (t Token) Node() Node { return Node{Name: t.Owner, Incarnation: t.Incarnation} }

// IsZero reports whether t is the zero token (no owner, epoch 0).
func (t Token) IsZero() bool {
	return t.Epoch == 0 && t.Owner == "" && t.Incarnation == 0
}

// Compare orders two tokens of the same partition by (Epoch, Owner,
// Incarnation), owner names compared bytewise. It returns -1, 0 or +1. The
// partition and the MAC are not compared.
func (t Token) Compare(u Token) int {
	if c := cmp.Compare(t.Epoch, u.Epoch); c != 0 {
		return c
	}
	if c := strings.Compare(t.Owner, u.Owner); c != 0 {
		return c
	}
	return cmp.Compare(t.Incarnation, u.Incarnation)
}

// Less reports whether t orders before u.
func (t Token) Less(u Token) bool { return t.Compare(u) < 0 }

// Same reports whether t and u name the same grant: same partition, epoch,
// owner and incarnation (the MAC is not compared).
func (t Token) Same(u Token) bool {
	return t.Partition == u.Partition && t.Compare(u) == 0
}

// LogValue makes log/slog print a token in its readable form
// (p73@e1:node-1/00000000000000a1), not its MarshalText form.
func (t Token) LogValue() slog.Value { return slog.StringValue(t.String()) }

func (t Token) String() string {
	return fmt.Sprintf("p%d@e%d:%s/%016x", t.Partition, t.Epoch, t.Owner, t.Incarnation)
}
