package gossip

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/quorum"
)

func gossipSamples(t testing.TB, keys *ownership.Keyring) []Message {
	reg, err := NewRegister(8)
	if err != nil {
		t.Fatal(err)
	}
	reg.ObserveClaim(Claim{Token: keys.Sign(ownership.Token{Partition: 1, Epoch: 3, Owner: "a", Incarnation: 7})})
	reg.ObserveClaim(Claim{Token: keys.Sign(ownership.Token{Partition: 5, Epoch: 1, Owner: "b", Incarnation: 9}), Released: true})
	return []Message{
		{Kind: KindClaim, Cluster: "c1", Sender: "a", Claim: Claim{Token: keys.Sign(ownership.Token{Partition: 2, Epoch: 4, Owner: "a", Incarnation: 7})}},
		{Kind: KindClaim, Cluster: "", Sender: "a", Claim: Claim{Token: keys.Sign(ownership.Token{Partition: 2, Epoch: 4, Owner: "a", Incarnation: 7}), Released: true}},
		{Kind: KindStable, Cluster: "c1", Sender: "b", Stable: quorum.NewStable(3, []string{"c", "a", "b"})},
		{Kind: KindStable, Cluster: "c1", Sender: "b"},
		{Kind: KindState, Cluster: "c1", Sender: "b", Stable: quorum.NewStable(2, []string{"a", "b"}), Register: reg},
		{Kind: KindState, Cluster: "c1", Sender: "b", Register: reg},
		{Kind: KindDigest, Cluster: "c1", Sender: "b", Stable: quorum.NewStable(2, []string{"a", "b"}), Digest: reg.Digest()},
		{Kind: KindDigest, Cluster: "c1", Sender: "b", Digest: Digest{Partitions: 4096, Hashes: make([]uint64, DigestRanges)}},
		{Kind: KindSection, Cluster: "c1", Sender: "a", Section: reg.Sections([]int{1, 3, 5}, 100)[0]},
		{Kind: KindSection, Cluster: "c1", Sender: "a", Section: Section{Partitions: 8, Ranges: []int{0, 7}}},
		{Kind: KindAskStable, Cluster: "c1", Sender: "a", Stable: quorum.NewStable(2, []string{"a", "b"})},
		{Kind: KindAskStable, Cluster: "c1", Sender: "a"},
	}
}

// partitionsOf returns the partition count of m's state, digest or
// section (zero for another kind).
func partitionsOf(m Message) int {
	switch m.Kind {
	case KindState:
		return m.Register.Partitions()
	case KindDigest:
		return m.Digest.Partitions
	case KindSection:
		return m.Section.Partitions
	}
	return 0
}

func sameGossip(a, b Message) bool {
	if a.Kind != b.Kind || a.Cluster != b.Cluster || a.Sender != b.Sender || a.Claim != b.Claim ||
		a.Stable.ID() != b.Stable.ID() || (a.Register == nil) != (b.Register == nil) {
		return false
	}
	if !a.Digest.Equal(b.Digest) || a.Section.Partitions != b.Section.Partitions || a.Section.Ask != b.Section.Ask ||
		!slices.Equal(a.Section.Ranges, b.Section.Ranges) || !slices.Equal(a.Section.Claims, b.Section.Claims) {
		return false
	}
	if a.Register != nil {
		x, _ := a.Register.MarshalBinary()
		y, _ := b.Register.MarshalBinary()
		return bytes.Equal(x, y)
	}
	return true
}

func TestGossipRoundTrip(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	for _, k := range []*ownership.Keyring{nil, keys} {
		for _, m := range gossipSamples(t, k) {
			b, err := m.Seal(k)
			if err != nil {
				t.Fatalf("Seal(%+v): %v", m, err)
			}
			got, err := Open(b, m.Kind.Channel(), m.Cluster, k)
			if err != nil {
				t.Fatalf("Open(Seal(%+v)): %v", m, err)
			}
			if !sameGossip(got, m) {
				t.Fatalf("round trip: got %+v, want %+v", got, m)
			}
			if again, _ := got.Seal(k); !bytes.Equal(again, b) {
				t.Fatalf("encoding is not canonical: %x then %x", b, again)
			}
		}
	}
}

// Issue 11, defect 2: gossip from another cluster, unsigned gossip in a
// keyed cluster, a forged MAC, and a forged token inside a signed message
// are all refused.
func TestOpenGossipRefuses(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	other, _ := ownership.NewKeyring(macTestKey(2))
	m := gossipSamples(t, keys)[0]

	plain, _ := m.Seal(nil)
	if _, err := Open(plain, Broadcast, "c2", nil); !errors.Is(err, ErrWrongCluster) {
		t.Errorf("another cluster's claim: %v, want ErrWrongCluster", err)
	}
	if _, err := Open(plain, Broadcast, "c1", keys); !errors.Is(err, ownership.ErrBadMAC) {
		t.Errorf("unsigned claim in a keyed cluster: %v, want ErrBadMAC", err)
	}
	forged, _ := m.Seal(other)
	if _, err := Open(forged, Broadcast, "c1", keys); !errors.Is(err, ownership.ErrBadMAC) {
		t.Errorf("claim sealed under another key: %v, want ErrBadMAC", err)
	}
	signed, _ := m.Seal(keys)
	for i := range signed {
		b := bytes.Clone(signed)
		b[i] ^= 0x01
		if _, err := Open(b, Broadcast, "c1", keys); err == nil {
			t.Fatalf("a flipped bit at %d went unnoticed", i)
		}
	}
	// A keyholder relaying a token nobody signed: the message MAC verifies,
	// the token's does not.
	bad := m
	bad.Claim.Token = ownership.Token{Partition: 2, Epoch: math.MaxUint64, Owner: "x", Incarnation: 1}
	b, _ := bad.Seal(keys)
	if _, err := Open(b, Broadcast, "c1", keys); !errors.Is(err, ownership.ErrBadMAC) {
		t.Errorf("unsigned token in a signed message: %v, want ErrBadMAC", err)
	}
}

// Issue 22 review: a claim of a state or a section whose token does not
// verify (signed under a key this node no longer holds, during a key
// rotation, or forged by a keyholder) used to make Open refuse the whole
// message, and with it every good claim in it and, for an asking section,
// its answer: repair stopped both ways. Open drops only the claims that
// fail, counts them, and keeps the rest.
func TestOpenDropsOnlyUnverifiedClaims(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	old, _ := ownership.NewKeyring(macTestKey(2))
	reg, _ := NewRegister(8)
	good := []Claim{
		{Token: keys.Sign(ownership.Token{Partition: 1, Epoch: 3, Owner: "a", Incarnation: 7})},
		{Token: keys.Sign(ownership.Token{Partition: 5, Epoch: 1, Owner: "b", Incarnation: 9}), Released: true},
	}
	bad := []Claim{
		{Token: old.Sign(ownership.Token{Partition: 2, Epoch: 4, Owner: "a", Incarnation: 7})},    // a retired key
		{Token: ownership.Token{Partition: 7, Epoch: math.MaxUint64, Owner: "x", Incarnation: 1}}, // nobody's
	}
	for _, c := range append(slices.Clone(good), bad...) {
		reg.ObserveClaim(c)
	}
	for _, m := range []Message{
		{Kind: KindState, Stable: quorum.NewStable(2, []string{"a", "b"}), Register: reg},
		{Kind: KindSection, Section: reg.Sections([]int{0, 1, 2, 3, 4, 5, 6, 7}, 100)[0]},
	} {
		m.Cluster, m.Sender = "c1", "a"
		b, err := m.Seal(keys)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Open(b, m.Kind.Channel(), "c1", keys)
		if err != nil {
			t.Fatalf("%v with %d unverified claims refused whole: %v", m.Kind, len(bad), err)
		}
		if claims := slices.Collect(got.Claims()); !slices.Equal(claims, good) || got.Unverified != len(bad) {
			t.Errorf("%v opened with claims %v, %d unverified; want %v, %d", m.Kind, claims, got.Unverified, good, len(bad))
		}
		if m.Kind == KindSection && (!got.Section.Ask || !slices.Equal(got.Section.Ranges, m.Section.Ranges)) {
			t.Errorf("section opened as %+v, sent as %+v", got.Section, m.Section)
		}
		// Unkeyed, nothing is checked or dropped.
		if got, err := Open(b, m.Kind.Channel(), "c1", nil); err != nil || got.Unverified != 0 || len(slices.Collect(got.Claims())) != len(good)+len(bad) {
			t.Errorf("%v opened without keys: %d claims, %d unverified, %v", m.Kind, len(slices.Collect(got.Claims())), got.Unverified, err)
		}
	}
}

// Issue 22 review: a push/pull state's register was allocated at the
// partition count its sender wrote, 64 bytes a partition (4 MB at 65,536
// for a message of a few bytes), before anything was compared with the
// node's own. An Opener of the node's count refuses a state, digest or
// section of another count with ErrPartitionRange, having allocated
// nothing sized by it, and opens one of its own count whole.
func TestOpenerRefusesAnotherPartitionCount(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	big, _ := NewRegister(MaxPartitions)
	big.ObserveClaim(Claim{Token: keys.Sign(ownership.Token{Partition: 60000, Epoch: 3, Owner: "a", Incarnation: 7})})
	small, _ := NewRegister(8)
	small.ObserveClaim(Claim{Token: keys.Sign(ownership.Token{Partition: 3, Epoch: 3, Owner: "a", Incarnation: 7})})
	for _, m := range []Message{
		{Kind: KindState, Register: big},
		{Kind: KindDigest, Digest: big.Digest()},
		{Kind: KindSection, Section: big.Sections([]int{29}, 10)[0]},
	} {
		m.Cluster, m.Sender = "c1", "a"
		b, err := m.Seal(keys)
		if err != nil {
			t.Fatal(err)
		}
		o := Opener{Cluster: "c1", Keys: keys, Partitions: 8}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		got, err := o.Open(b, m.Kind.Channel())
		runtime.ReadMemStats(&ms)
		// The test runs alone (no t.Parallel in this package): what was
		// allocated meanwhile is Open's, or the runtime's (a few KB).
		n := ms.TotalAlloc - before
		if n > 64<<10 {
			t.Errorf("refusing a %v of %d partitions allocated %d bytes", m.Kind, MaxPartitions, n)
		}
		t.Logf("refusing a %v of %d partitions (%d bytes) allocated %d bytes", m.Kind, MaxPartitions, len(b), n)
		if !errors.Is(err, ownership.ErrPartitionRange) || got.Kind != 0 {
			t.Errorf("%v of %d partitions opened for 8: %+v, %v", m.Kind, MaxPartitions, got, err)
		}
	}
	// Of the node's own count: opened whole.
	for _, m := range []Message{
		{Kind: KindState, Register: small},
		{Kind: KindDigest, Digest: small.Digest()},
		{Kind: KindSection, Section: small.Sections([]int{3}, 10)[0]},
	} {
		m.Cluster, m.Sender = "c1", "a"
		b, _ := m.Seal(keys)
		got, err := Opener{Cluster: "c1", Keys: keys, Partitions: 8}.Open(b, m.Kind.Channel())
		if err != nil || !sameGossip(got, m) {
			t.Errorf("%v of 8 partitions opened for 8: %+v, %v", m.Kind, got, err)
		}
	}
}

// Issue 19, defect 1: a claim or stable membership sent as push/pull state
// was opened, and its missing register crashed the node. Each kind opens
// only on its own channel, keyed or not, and a kind of another channel is
// refused before its body is read (a body that would not even parse gets
// the same error).
func TestOpenGossipOnlyOnItsChannel(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	for _, k := range []*ownership.Keyring{nil, keys} {
		for _, m := range gossipSamples(t, k) {
			b, err := m.Seal(k)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range []Channel{Broadcast, PushPull} {
				got, err := Open(b, ch, m.Cluster, k)
				if ch == m.Kind.Channel() {
					if err != nil {
						t.Fatalf("a %v on its own channel: %v", m.Kind, err)
					}
					continue
				}
				if !errors.Is(err, ownership.ErrMalformedToken) || !strings.Contains(err.Error(), "channel") || got.Kind != 0 {
					t.Fatalf("a %v (keys %v) on the %v channel: %+v, %v", m.Kind, k != nil, ch, got, err)
				}
				cut := bytes.Clone(b[:6+len(m.Cluster)+len(m.Sender)+1]) // the header and one byte
				cut[3] = 0                                               // no MAC flag
				if _, err := Open(cut, ch, m.Cluster, nil); err == nil || !strings.Contains(err.Error(), "channel") {
					t.Fatalf("a truncated %v on the %v channel: %v, want the channel refused first", m.Kind, ch, err)
				}
			}
		}
	}
}

func TestOpenGossipRejectsMalformed(t *testing.T) {
	good, _ := gossipSamples(t, nil)[2].Seal(nil)
	cases := map[string][]byte{
		"empty":          nil,
		"old claim":      mustClaim(t, Claim{Token: ownership.Token{Partition: 1, Epoch: 1, Owner: "a"}}),
		"bad kind":       append([]byte{gossipMagic, gossipVersion, 9}, good[3:]...),
		"version 1":      append([]byte{gossipMagic, 1}, good[2:]...),
		"unknown flag":   append([]byte{gossipMagic, gossipVersion, 2, 0x80}, good[4:]...),
		"truncated":      good[:len(good)-1],
		"trailing":       append(bytes.Clone(good), 0),
		"no sender":      {gossipMagic, gossipVersion, 2, 0, 2, 'c', '1', 0, 1, 1, 1, 'a'},
		"unsorted":       {gossipMagic, gossipVersion, 2, 0, 2, 'c', '1', 1, 'a', 1, 2, 1, 'b', 1, 'a'},
		"version 0 with": {gossipMagic, gossipVersion, 2, 0, 2, 'c', '1', 1, 'a', 0, 1, 1, 'a'},
		"huge count":     {gossipMagic, gossipVersion, 2, 0, 2, 'c', '1', 1, 'a', 1, 0xff, 0x7f},
	}
	for name, b := range cases {
		if _, err := Open(b, Broadcast, "c1", nil); !errors.Is(err, ownership.ErrMalformedToken) {
			t.Errorf("%s: %v, want ErrMalformedToken", name, err)
		}
	}
}

func mustClaim(t *testing.T, c Claim) []byte {
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Issue 11, defect 2: one forged claim with epoch 2^64-1 made a partition
// unclaimable ("epoch exhausted"). A heard claim may raise an epoch by at
// most MaxEpochJump, and the gossip authority can still mint above what
// is left.
func TestObserveHeardBoundsTheEpochJump(t *testing.T) {
	r, _ := NewRegister(4)
	a, _ := NewAuthority(r, nil)
	forged := Claim{Token: ownership.Token{Partition: 1, Epoch: math.MaxUint64, Owner: "evil", Incarnation: 1}}
	if changed, err := r.ObserveHeard(forged); changed || !errors.Is(err, ownership.ErrMalformedToken) {
		t.Fatalf("ObserveHeard(epoch 2^64-1) = %v, %v; want refused", changed, err)
	}
	ok := Claim{Token: ownership.Token{Partition: 1, Epoch: MaxEpochJump, Owner: "b", Incarnation: 1}}
	if changed, err := r.ObserveHeard(ok); !changed || err != nil {
		t.Fatalf("ObserveHeard(a jump of exactly MaxEpochJump) = %v, %v", changed, err)
	}
	if changed, err := r.ObserveHeard(Claim{Token: ownership.Token{Partition: 1, Epoch: 2*MaxEpochJump + 1, Owner: "b", Incarnation: 1}}); changed || err == nil {
		t.Fatalf("a second jump above the bound was accepted")
	}
	tok, err := a.Claim(t.Context(), 1, ownership.Node{Name: "a", Incarnation: 2}, ownership.Token{})
	if err != nil || tok.Epoch != MaxEpochJump+1 {
		t.Fatalf("claim after the jump = %v, %v", tok, err)
	}
}

func FuzzOpen(f *testing.F) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	for _, k := range []*ownership.Keyring{nil, keys} {
		for _, m := range gossipSamples(f, k) {
			b, err := m.Seal(k)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, k != nil)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, keyed bool) {
		k := (*ownership.Keyring)(nil)
		if keyed {
			k = keys
		}
		opened := 0
		for _, ch := range []Channel{Broadcast, PushPull} {
			m, err := Open(b, ch, "c1", k)
			// A node of 8 partitions opens the same, or refuses a
			// message of another count.
			m8, err8 := Opener{Cluster: "c1", Keys: k, Partitions: 8}.Open(b, ch)
			if err != nil {
				if m.Kind != 0 || m.Register != nil {
					t.Fatalf("error %v with a non-zero message %+v", err, m)
				}
				if err8 == nil {
					t.Fatalf("%x opened for 8 partitions, not for any: %v", b, err)
				}
				continue
			}
			opened++
			if parts := partitionsOf(m); parts != 0 && parts != 8 {
				if !errors.Is(err8, ownership.ErrPartitionRange) {
					t.Fatalf("a message of %d partitions opened for 8: %v", parts, err8)
				}
			} else if err8 != nil || !sameGossip(m, m8) || m8.Unverified != m.Unverified {
				t.Fatalf("%x opened for 8 partitions as %+v, %v; for any as %+v", b, m8, err8, m)
			}
			if m.Kind.Channel() != ch {
				t.Fatalf("a %v message opened on the %v channel", m.Kind, ch)
			}
			if (m.Kind == KindState) != (m.Register != nil) {
				t.Fatalf("a %v message with register %v", m.Kind, m.Register)
			}
			for c := range m.Claims() {
				if err := k.Verify(c.Token); k != nil && err != nil {
					t.Fatalf("opened a claim that does not verify: %v", err)
				}
			}
			again, err := m.Seal(k)
			if err != nil {
				t.Fatalf("Seal of an opened message: %v", err)
			}
			if m.Unverified > 0 {
				continue // re-sealed without the claims it dropped
			}
			want := b
			if !keyed && b[3]&gossipFlagMAC != 0 {
				// A node without keys accepts a signed message; re-sealed
				// without keys it loses the flag and the MAC.
				want = bytes.Clone(b[:len(b)-ownership.MACSize])
				want[3] &^= gossipFlagMAC
			}
			if !bytes.Equal(again, want) {
				t.Fatalf("not canonical: %x decoded, %x encoded", b, again)
			}
		}
		if opened > 1 {
			t.Fatalf("%x opened on both channels", b)
		}
	})
}

// Issue 19: what a replayed authentic message can do (see the package's
// comment in gossip.go), each bounded by a monotone merge: a claim heard twice
// changes nothing the second time, an older claim or release heard after
// a newer one is ignored, a stable membership the node has moved past is
// ignored, and an old state replayed after newer claims and a newer set
// moves nothing back. Each replay goes through the codec, as one copied
// off the wire would. (The stable membership's replays are the machine's:
// TestReplayedStableIsBounded in package ownership/machine.)
func TestReplayedGossipIsBounded(t *testing.T) {
	keys, _ := ownership.NewKeyring(macTestKey(1))
	for _, k := range []*ownership.Keyring{nil, keys} {
		reopen := func(m Message) Message {
			t.Helper()
			m.Cluster, m.Sender = "c1", "a"
			b, err := m.Seal(k)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Open(b, m.Kind.Channel(), "c1", k)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		old, _ := NewRegister(8)
		reg, _ := NewRegister(8)
		first := Claim{Token: k.Sign(ownership.Token{Partition: 1, Epoch: 3, Owner: "a", Incarnation: 7})}
		old.ObserveClaim(first)
		state := reopen(Message{Kind: KindState, Stable: quorum.NewStable(2, []string{"a", "b", "c"}), Register: old})

		// A claim heard twice.
		for i, want := range []bool{true, false} {
			if changed, err := reg.ObserveHeard(reopen(Message{Kind: KindClaim, Claim: first}).Claim); changed != want || err != nil {
				t.Fatalf("claim heard %d times: changed %v, %v", i+1, changed, err)
			}
		}
		// Then a newer one: the release of epoch 3 and a claim of epoch 4.
		// The older claim, replayed, is ignored.
		newer := Claim{Token: k.Sign(ownership.Token{Partition: 1, Epoch: 4, Owner: "b", Incarnation: 9})}
		for _, c := range []Claim{{Token: first.Token, Released: true}, newer} {
			if changed, _ := reg.ObserveHeard(c); !changed {
				t.Fatalf("%v not taken", c)
			}
		}
		for _, c := range []Claim{first, {Token: first.Token, Released: true}} {
			if changed, err := reg.ObserveHeard(reopen(Message{Kind: KindClaim, Claim: c}).Claim); changed || err != nil {
				t.Fatalf("replayed %v after %v: changed %v, %v", c, newer, changed, err)
			}
		}
		// The old state, replayed: nothing moves back.
		for c := range state.Claims() {
			if changed, _ := reg.ObserveHeard(c); changed {
				t.Fatalf("an old state's %v changed the register", c)
			}
		}
		if got := reg.GetClaim(1); got != newer {
			t.Fatalf("p1 is %v after the replays, want %v", got, newer)
		}
	}
}

// Issue 19, defect 1: a gossip MAC covered the kind byte but not where the
// message may be used. It is bound to its channel now: a broadcast's MAC
// does not verify as push/pull state nor the other way round, under any
// key of the ring, and it is a MAC of the whole message; nor does it
// verify as an Authenticate MAC of a purpose (for example node metadata).
func TestGossipMACBindsTheChannel(t *testing.T) {
	oldKey, newKey := ownership.Key("the old key of this cluster...."), ownership.Key("the new key of this cluster....")
	old, _ := ownership.NewKeyring(oldKey)
	rotated, _ := ownership.NewKeyring(newKey, oldKey)
	msg := []byte("gossip message bytes")
	chans := []Channel{Broadcast, PushPull}
	for _, ch := range chans {
		mac := old.MAC(macContext(ch), msg)
		if !old.VerifyMAC(macContext(ch), msg, mac[:]) || !rotated.VerifyMAC(macContext(ch), msg, mac[:]) {
			t.Fatalf("a %v MAC does not verify on its own channel", ch)
		}
		if old.VerifyMAC(macContext(ch), append(msg, 0), mac[:]) {
			t.Fatalf("a %v MAC verified for another message", ch)
		}
		if old.Authentic("node metadata", msg, mac[:]) {
			t.Fatalf("a gossip MAC for %v verified as a purpose's", ch)
		}
		for _, other := range chans {
			if other != ch && (old.VerifyMAC(macContext(other), msg, mac[:]) || rotated.VerifyMAC(macContext(other), msg, mac[:])) {
				t.Fatalf("a %v MAC verified on the %v channel", ch, other)
			}
		}
	}
}
