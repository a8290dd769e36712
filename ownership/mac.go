package ownership

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"sync"
)

// MinKeySize is the shortest cluster key NewKeyring accepts, in bytes.
const MinKeySize = 16

// A Key is a cluster secret that authenticates tokens. Every node that mints
// tokens and every resource that verifies them holds it. Draw it from a
// cryptographic random source (32 bytes is a good length) and keep it out of
// logs.
type Key []byte

// macContext separates token MACs from any other use of a cluster key.
const macContext = "tenure token mac v1\x00"

// A Keyring signs tokens with its primary key and verifies them under any of
// its keys, so a cluster rotates keys without downtime:
//
//  1. add the new key as an older key on every node and resource;
//  2. make it the primary everywhere (old key kept as an older key);
//  3. once every token signed by the old key is retired, drop it.
//
// A Keyring is immutable and safe for concurrent use.
//
// A nil *Keyring disables authentication: Sign returns its token unchanged
// and Verify accepts every token, signed or not.
type Keyring struct {
	keys []*macKey // primary first
}

type macKey struct {
	key  []byte
	pool sync.Pool // of hash.Hash: HMAC-SHA256 states keyed with key
}

// NewKeyring returns a keyring that signs with primary and also verifies
// tokens signed with any of others. Every key must be at least MinKeySize
// bytes. The keyring copies the keys.
func NewKeyring(primary Key, others ...Key) (*Keyring, error) {
	k := &Keyring{}
	for i, key := range append([]Key{primary}, others...) {
		if len(key) < MinKeySize {
			return nil, fmt.Errorf("ownership: key %d is %d bytes, at least %d needed", i, len(key), MinKeySize)
		}
		mk := &macKey{key: append([]byte(nil), key...)}
		mk.pool.New = func() any { return hmac.New(sha256.New, mk.key) }
		k.keys = append(k.keys, mk)
	}
	return k, nil
}

// Sign returns t with its MAC set under the primary key. The MAC covers the
// partition, epoch, owner and incarnation; any previous MAC is replaced.
func (k *Keyring) Sign(t Token) Token {
	if k == nil {
		return t
	}
	t.MAC = k.keys[0].sum(t)
	return t
}

// Verify returns nil if t's MAC verifies under one of the keyring's keys,
// and otherwise an error wrapping ErrBadMAC (an unsigned token fails too).
// Comparisons take constant time.
func (k *Keyring) Verify(t Token) error {
	if k == nil {
		return nil
	}
	if t.MAC == ([MACSize]byte{}) {
		return fmt.Errorf("%w: %v is unsigned", ErrBadMAC, t)
	}
	ok := false
	for _, mk := range k.keys {
		m := mk.sum(t)
		// Try every key, so the time taken says nothing about which matched.
		ok = hmac.Equal(m[:], t.MAC[:]) || ok
	}
	if !ok {
		return fmt.Errorf("%w: %v", ErrBadMAC, t)
	}
	return nil
}

// sum computes the truncated HMAC-SHA256 of t's signed fields.
func (mk *macKey) sum(t Token) [MACSize]byte {
	var buf [len(macContext) + binary.MaxVarintLen32 + 3*binary.MaxVarintLen64 + 64]byte
	b := append(buf[:0], macContext...)
	b = binary.AppendUvarint(b, uint64(t.Partition))
	b = binary.AppendUvarint(b, t.Epoch)
	b = binary.AppendUvarint(b, t.Incarnation)
	b = binary.AppendUvarint(b, uint64(len(t.Owner)))
	b = append(b, t.Owner...)
	return mk.hmac(b, nil)
}

// hmac computes the truncated HMAC-SHA256 of a followed by b.
func (mk *macKey) hmac(a, b []byte) [MACSize]byte {
	h := mk.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(a)
	h.Write(b)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	mk.pool.Put(h)

	var m [MACSize]byte
	copy(m[:], sum[:])
	return m
}

// purposeContext separates MACs made with Authenticate from token and
// gossip MACs, and the purposes from each other.
const purposeContext = "tenure mac v1 "

// Authenticate returns the MAC of msg under the primary key for purpose,
// which names what the bytes are (for example "node metadata"): a MAC
// made for one purpose verifies for no other, nor as a token's or a gossip
// message's. purpose must not contain a zero byte. A nil Keyring returns
// the zero MAC.
func (k *Keyring) Authenticate(purpose string, msg []byte) [MACSize]byte {
	return k.MAC(purposeContext+purpose+"\x00", msg)
}

// Authentic reports whether mac is Authenticate's MAC of msg for purpose
// under one of the keys, in constant time. A nil Keyring accepts every
// message.
func (k *Keyring) Authentic(purpose string, msg, mac []byte) bool {
	return k.VerifyMAC(purposeContext+purpose+"\x00", msg, mac)
}

// MAC returns the MAC of context followed by msg under the primary key: the
// primitive under Authenticate and the gossip codec's MACs. The context is
// what keeps one kind of MAC from verifying as another, so it must be a
// constant that names a format and ends in a zero byte, used by no other
// kind (token MACs begin "tenure token mac", Authenticate's "tenure mac",
// gossip's "tenure gossip"). Prefer Authenticate. A nil Keyring returns the
// zero MAC.
func (k *Keyring) MAC(context string, msg []byte) [MACSize]byte {
	if k == nil {
		return [MACSize]byte{}
	}
	return k.keys[0].hmac([]byte(context), msg)
}

// VerifyMAC reports whether mac is MAC's of context and msg under one of
// the keys, in constant time. A nil Keyring accepts every message.
func (k *Keyring) VerifyMAC(context string, msg, mac []byte) bool {
	if k == nil {
		return true
	}
	ctx := []byte(context)
	ok := false
	for _, mk := range k.keys {
		m := mk.hmac(ctx, msg)
		ok = hmac.Equal(m[:], mac) || ok
	}
	return ok
}
