package ownership

import (
	"bytes"
	"errors"
	"testing"
)

func macTestKey(b byte) Key { return bytes.Repeat([]byte{b}, 32) }

func TestKeyringSignVerify(t *testing.T) {
	k, err := NewKeyring(macTestKey(1))
	if err != nil {
		t.Fatal(err)
	}
	tok := Token{Partition: 4, Epoch: 9, Owner: "node-a", Incarnation: 77}
	signed := k.Sign(tok)
	if signed.MAC == ([MACSize]byte{}) {
		t.Fatal("Sign left the MAC zero")
	}
	if signed.Compare(tok) != 0 || !signed.Same(tok) {
		t.Fatalf("Sign changed the token: %v", signed)
	}
	if err := k.Verify(signed); err != nil {
		t.Fatalf("Verify(signed): %v", err)
	}
	if again := k.Sign(signed); again != signed {
		t.Errorf("Sign is not deterministic: %x then %x", signed.MAC, again.MAC)
	}
	if err := k.Verify(tok); !errors.Is(err, ErrBadMAC) {
		t.Errorf("Verify(unsigned) = %v", err)
	}
	tampered := []Token{signed, signed, signed, signed, signed}
	tampered[0].Partition++
	tampered[1].Epoch++
	tampered[2].Owner = "node-b"
	tampered[3].Incarnation++
	tampered[4].MAC[MACSize-1] ^= 1
	for i, bad := range tampered {
		if err := k.Verify(bad); !errors.Is(err, ErrBadMAC) {
			t.Errorf("tampered %d (%v): Verify = %v", i, bad, err)
		}
	}
	// The owner's length is covered: moving bytes between fields fails.
	a := k.Sign(Token{Epoch: 1, Owner: "ab"})
	b := Token{Epoch: 1, Owner: "a", MAC: a.MAC}
	if err := k.Verify(b); !errors.Is(err, ErrBadMAC) {
		t.Errorf("Verify of a shifted owner = %v", err)
	}
}

func TestKeyringRotation(t *testing.T) {
	old, _ := NewKeyring(macTestKey(1))
	both, _ := NewKeyring(macTestKey(2), macTestKey(1))
	next, _ := NewKeyring(macTestKey(2))
	tok := Token{Partition: 1, Epoch: 3, Owner: "n", Incarnation: 5}

	byOld, byNew := old.Sign(tok), both.Sign(tok)
	if byOld.MAC == byNew.MAC {
		t.Fatal("different primaries gave the same MAC")
	}
	if byNew != next.Sign(tok) {
		t.Error("the primary did not sign")
	}
	for _, tc := range []struct {
		name string
		k    *Keyring
		t    Token
		ok   bool
	}{
		{"both/old", both, byOld, true},
		{"both/new", both, byNew, true},
		{"old/new", old, byNew, false},
		{"next/old", next, byOld, false},
		{"next/new", next, byNew, true},
	} {
		if err := tc.k.Verify(tc.t); (err == nil) != tc.ok {
			t.Errorf("%s: Verify = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestKeyringNil(t *testing.T) {
	var k *Keyring
	tok := Token{Epoch: 1, Owner: "n", MAC: [MACSize]byte{3}}
	if got := k.Sign(tok); got != tok {
		t.Errorf("nil Sign changed the token: %v", got)
	}
	if err := k.Verify(Token{Epoch: 1}); err != nil {
		t.Errorf("nil Verify: %v", err)
	}
}

func TestNewKeyringRejectsShortKeys(t *testing.T) {
	if _, err := NewKeyring(make(Key, MinKeySize-1)); err == nil {
		t.Error("short primary accepted")
	}
	if _, err := NewKeyring(macTestKey(1), macTestKey(2), Key("short")); err == nil {
		t.Error("short older key accepted")
	}
	if _, err := NewKeyring(nil); err == nil {
		t.Error("nil key accepted")
	}
}

func TestKeyringCopiesKeys(t *testing.T) {
	key := macTestKey(1)
	k, _ := NewKeyring(key)
	tok := k.Sign(Token{Epoch: 1, Owner: "n"})
	key[0] ^= 0xff
	if err := k.Verify(tok); err != nil {
		t.Errorf("changing the caller's key changed the keyring: %v", err)
	}
}

func BenchmarkKeyringVerify(b *testing.B) {
	k, _ := NewKeyring(macTestKey(1))
	tok := k.Sign(Token{Partition: 17, Epoch: 12345, Owner: "node-7.example", Incarnation: 99})
	b.ReportAllocs()
	for b.Loop() {
		if err := k.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// Authenticate's MACs are separated by purpose, and from token MACs (and
// from gossip MACs: TestGossipMACBindsTheChannel in ownership/gossip);
// Authentic checks every key of the ring (rotation), and a nil
// Keyring accepts everything.
func TestKeyringAuthenticatePurposes(t *testing.T) {
	oldKey, newKey := Key("the old key of this cluster...."), Key("the new key of this cluster....")
	old, err := NewKeyring(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := NewKeyring(newKey, oldKey)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("node metadata bytes")
	mac := old.Authenticate("node metadata", msg)
	if !old.Authentic("node metadata", msg, mac[:]) || !rotated.Authentic("node metadata", msg, mac[:]) {
		t.Fatal("a MAC does not verify under its own key")
	}
	if old.Authentic("something else", msg, mac[:]) {
		t.Fatal("a MAC verified for another purpose")
	}
	if old.Authentic("node metadata", append(msg, 0), mac[:]) {
		t.Fatal("a MAC verified for another message")
	}
	tok := old.Sign(Token{Partition: 1, Epoch: 2, Owner: "a", Incarnation: 3})
	if old.Authentic("node metadata", msg, tok.MAC[:]) {
		t.Fatal("a token MAC verified as a purpose's")
	}
	var none *Keyring
	if z := none.Authenticate("node metadata", msg); z != ([MACSize]byte{}) || !none.Authentic("node metadata", msg, nil) {
		t.Fatal("a nil Keyring does not accept everything")
	}
}
