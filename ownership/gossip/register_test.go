package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tenure-go/tenure/ownership"
)

func TestClaimCompare(t *testing.T) {
	grant := Claim{Token: memTok(0, 5, "b")}
	release := Claim{Token: grant.Token, Released: true}
	higher := Claim{Token: memTok(0, 6, "a")}
	lowerOwner := Claim{Token: memTok(0, 5, "a"), Released: true}
	ordered := []Claim{{}, lowerOwner, grant, release, higher, {Token: higher.Token, Released: true}}
	for i, a := range ordered {
		for j, b := range ordered {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%v.Compare(%v) = %d, want %d", a, b, got, want)
			}
		}
	}
	if !(Claim{}).IsZero() || grant.IsZero() || (Claim{Released: true}).IsZero() {
		t.Error("IsZero")
	}
}

func TestClaimEncoding(t *testing.T) {
	for _, tok := range codecTokens() {
		for _, rel := range []bool{false, true} {
			c := Claim{Token: tok, Released: rel}
			b, err := c.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > ownership.MaxTokenSize {
				t.Errorf("%v: %d bytes", c, len(b))
			}
			got, err := ParseClaim(b)
			if err != nil || got != c {
				t.Errorf("ParseClaim(%x) = %v, %v; want %v", b, got, err, c)
			}
			var u Claim
			if err := u.UnmarshalBinary(b); err != nil || u != c {
				t.Errorf("UnmarshalBinary = %v, %v", u, err)
			}
			// An unreleased claim is encoded as its token; a release is not a token.
			_, err = ownership.ParseToken(b)
			if rel != (err != nil) {
				t.Errorf("%v: ParseToken of the claim: %v", c, err)
			}
		}
	}
	if _, err := ParseClaim([]byte{1, 4, 0, 0, 0, 0}); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("unknown flag: %v", err)
	}
	if _, err := (Claim{Token: ownership.Token{Owner: strings.Repeat("x", 256)}}).MarshalBinary(); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("long owner: %v", err)
	}
}

func TestRegisterObserveGet(t *testing.T) {
	r, err := NewRegister(4)
	if err != nil {
		t.Fatal(err)
	}
	t1, t2 := memTok(2, 1, "a"), memTok(2, 2, "b")
	steps := []struct {
		c       Claim
		changed bool
		want    Claim
	}{
		{Claim{Token: t1}, true, Claim{Token: t1}},
		{Claim{Token: t1}, false, Claim{Token: t1}},
		{Claim{Token: t1, Released: true}, true, Claim{Token: t1, Released: true}},
		{Claim{Token: t1}, false, Claim{Token: t1, Released: true}},
		{Claim{Token: t2}, true, Claim{Token: t2}},
		{Claim{Token: t1, Released: true}, false, Claim{Token: t2}},
		{Claim{}, false, Claim{Token: t2}},
		{Claim{Token: ownership.Token{Partition: 2}, Released: true}, false, Claim{Token: t2}},
	}
	for i, s := range steps {
		if got := r.ObserveClaim(s.c); got != s.changed {
			t.Errorf("step %d: ObserveClaim(%v) = %v", i, s.c, got)
		}
		if got := r.GetClaim(2); got != s.want {
			t.Errorf("step %d: GetClaim = %v, want %v", i, got, s.want)
		}
	}
	if r.Get(2) != t2 || !r.Get(1).IsZero() || !r.Get(99).IsZero() || !r.GetClaim(99).IsZero() {
		t.Error("Get")
	}
	if r.Observe(memTok(4, 1, "a")) || r.Observe(ownership.Token{Epoch: 1, Owner: strings.Repeat("x", 256)}) {
		t.Error("out of range or unencodable claim recorded")
	}
	if !r.Observe(memTok(0, 3, "c")) || r.Len() != 2 || r.Partitions() != 4 {
		t.Errorf("Len %d Partitions %d", r.Len(), r.Partitions())
	}
	got := slices.Collect(r.All())
	want := []Claim{{Token: memTok(0, 3, "c")}, {Token: t2}}
	if !slices.Equal(got, want) {
		t.Errorf("All = %v, want %v", got, want)
	}
	for range r.All() {
		break // early exit is allowed
	}
	for _, n := range []int{0, -1, MaxPartitions + 1} {
		if _, err := NewRegister(n); err == nil {
			t.Errorf("NewRegister(%d) accepted", n)
		}
	}
}

// regRand draws claims from a small domain, so collisions and ties (same
// token, different release flag or MAC) are common.
func regRand(rng *rand.Rand, partitions int) Claim {
	c := Claim{
		Token: ownership.Token{
			Partition:   uint32(rng.IntN(partitions)),
			Epoch:       uint64(rng.IntN(4)),
			Owner:       []string{"", "a", "b"}[rng.IntN(3)],
			Incarnation: uint64(rng.IntN(2)),
		},
		Released: rng.IntN(3) == 0,
	}
	if rng.IntN(2) == 0 {
		c.Token.MAC[rng.IntN(ownership.MACSize)] = byte(1 + rng.IntN(2))
	}
	return c
}

// regRef is the naive reference: a map holding, per partition, the maximum
// of every valid claim observed, by (Compare, MAC bytes).
type regRef map[uint32]Claim

func (m regRef) observe(c Claim) {
	if c.Token.IsZero() {
		return
	}
	cur, ok := m[c.Token.Partition]
	if !ok || c.Compare(cur) > 0 || c.Compare(cur) == 0 && bytes.Compare(c.Token.MAC[:], cur.Token.MAC[:]) > 0 {
		m[c.Token.Partition] = c
	}
}

func (m regRef) claims() []Claim {
	var out []Claim
	for _, c := range m {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int { return int(a.Token.Partition) - int(b.Token.Partition) })
	return out
}

func regState(r *Register) []Claim { return slices.Collect(r.All()) }

func regFrom(t *testing.T, partitions int, claims []Claim) *Register {
	t.Helper()
	r, err := NewRegister(partitions)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		r.ObserveClaim(c)
	}
	return r
}

func regMerge(t *testing.T, a, b *Register) *Register {
	t.Helper()
	out := regFrom(t, a.Partitions(), regState(a))
	if _, err := out.Merge(b); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRegisterHeldBy counts a holder's unreleased highest claims, and
// nothing for a released one, another holder or no name.
func TestRegisterHeldBy(t *testing.T) {
	r, err := NewRegister(5)
	if err != nil {
		t.Fatal(err)
	}
	r.Observe(memTok(0, 1, "a"))
	r.Observe(memTok(1, 1, "a"))
	r.Observe(memTok(2, 1, "b"))
	r.ObserveClaim(Claim{Token: memTok(3, 1, "a"), Released: true})
	r.Observe(memTok(4, 1, "a"))
	r.Observe(memTok(4, 2, "b")) // a's claim of 4 is no longer the highest
	for owner, want := range map[string]int{"a": 2, "b": 2, "c": 0, "": 0} {
		if got := r.HeldBy(owner); got != want {
			t.Errorf("HeldBy(%q) = %d, want %d", owner, got, want)
		}
	}
}

func TestRegisterMergeProperties(t *testing.T) {
	const partitions = 6
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		var sets [3][]Claim
		var regs [3]*Register
		for i := range sets {
			for range rng.IntN(12) {
				sets[i] = append(sets[i], regRand(rng, partitions))
			}
			regs[i] = regFrom(t, partitions, sets[i])
		}
		a, b, c := regs[0], regs[1], regs[2]

		// Against the reference, observed in any order.
		ref := regRef{}
		for _, cl := range sets[0] {
			ref.observe(cl)
		}
		if got, want := regState(a), ref.claims(); !slices.Equal(got, want) {
			t.Fatalf("iter %d: register %v, reference %v", iter, got, want)
		}
		shuffled := slices.Clone(sets[0])
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := regState(regFrom(t, partitions, shuffled)); !slices.Equal(got, regState(a)) {
			t.Fatalf("iter %d: order matters: %v vs %v", iter, got, regState(a))
		}

		// Merge is the union of observations.
		for _, cl := range sets[1] {
			ref.observe(cl)
		}
		ab, ba := regMerge(t, a, b), regMerge(t, b, a)
		if got, want := regState(ab), ref.claims(); !slices.Equal(got, want) {
			t.Fatalf("iter %d: a∪b %v, reference %v", iter, got, want)
		}
		if !slices.Equal(regState(ab), regState(ba)) {
			t.Fatalf("iter %d: not commutative: %v vs %v", iter, regState(ab), regState(ba))
		}
		if aa := regMerge(t, a, a); !slices.Equal(regState(aa), regState(a)) {
			t.Fatalf("iter %d: not idempotent", iter)
		}
		if abb := regMerge(t, ab, b); !slices.Equal(regState(abb), regState(ab)) {
			t.Fatalf("iter %d: merging twice changed the result", iter)
		}
		left, right := regMerge(t, ab, c), regMerge(t, a, regMerge(t, b, c))
		if !slices.Equal(regState(left), regState(right)) {
			t.Fatalf("iter %d: not associative: %v vs %v", iter, regState(left), regState(right))
		}

		// Merge reports exactly what changed.
		before := regState(a)
		m := regFrom(t, partitions, before)
		changed, err := m.Merge(b)
		if err != nil {
			t.Fatal(err)
		}
		var want []Claim
		for _, cl := range regState(ab) {
			if !slices.Contains(before, cl) {
				want = append(want, cl)
			}
		}
		if !slices.Equal(changed, want) {
			t.Fatalf("iter %d: Merge reported %v, want %v", iter, changed, want)
		}

		// Serialization round-trips, byte for byte.
		enc, err := ab.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		dec, err := UnmarshalRegister(enc)
		if err != nil {
			t.Fatalf("iter %d: UnmarshalRegister(%x): %v", iter, enc, err)
		}
		if !slices.Equal(regState(dec), regState(ab)) || dec.Len() != ab.Len() || dec.Partitions() != partitions {
			t.Fatalf("iter %d: round trip %v, want %v", iter, regState(dec), regState(ab))
		}
		if again, _ := dec.MarshalBinary(); !bytes.Equal(again, enc) {
			t.Fatalf("iter %d: re-encoding differs", iter)
		}
	}
}

func TestRegisterMergeSizeMismatch(t *testing.T) {
	a := regFrom(t, 4, []Claim{{Token: memTok(0, 1, "a")}})
	b := regFrom(t, 5, []Claim{{Token: memTok(0, 2, "b")}})
	if _, err := a.Merge(b); !errors.Is(err, ownership.ErrPartitionRange) {
		t.Fatalf("Merge of different sizes: %v", err)
	}
	if a.Get(0) != memTok(0, 1, "a") {
		t.Fatal("failed Merge changed the register")
	}
}

// Registers merging into each other concurrently converge and don't deadlock.
func TestRegisterConcurrentMerge(t *testing.T) {
	const partitions, nodes = 16, 4
	var regs [nodes]*Register
	for i := range regs {
		regs[i] = regFrom(t, partitions, nil)
	}
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(3, uint64(i)))
			for n := range 2000 {
				regs[i].Observe(memTok(uint32(rng.IntN(partitions)), uint64(n), fmt.Sprint(i)))
				if _, err := regs[i].Merge(regs[rng.IntN(nodes)]); err != nil {
					t.Error(err)
					return
				}
				if _, err := regs[i].MarshalBinary(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// A final round of merges: everyone holds the same state.
	for range 2 {
		for i := range regs {
			for j := range regs {
				if _, err := regs[i].Merge(regs[j]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for i := 1; i < nodes; i++ {
		if !slices.Equal(regState(regs[i]), regState(regs[0])) {
			t.Fatalf("register %d differs from register 0", i)
		}
	}
}

func TestUnmarshalRegisterRejects(t *testing.T) {
	r := regFrom(t, 8, []Claim{
		{Token: memTok(1, 3, "a")},
		{Token: memTok(4, 2, "b"), Released: true},
		{Token: ownership.Token{Partition: 5, Epoch: 9, Owner: "a", Incarnation: 21, MAC: [ownership.MACSize]byte{7}}},
	})
	good, _ := r.MarshalBinary()
	if _, err := UnmarshalRegister(good); err != nil {
		t.Fatal(err)
	}
	for i := range good {
		if _, err := UnmarshalRegister(good[:i]); !errors.Is(err, ownership.ErrMalformedToken) {
			t.Errorf("prefix of %d bytes: %v", i, err)
		}
	}
	if _, err := UnmarshalRegister(append(slices.Clone(good), 0)); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("trailing byte: %v", err)
	}
	cases := map[string][]byte{
		"version 2":           {2, 8, 0, 0},
		"zero partitions":     {1, 0, 0, 0},
		"too many partitions": {1, 0x81, 0x80, 0x04, 0, 0},
		"non-minimal count":   {1, 0x88, 0x00, 0, 0},
		"unused node":         {1, 8, 1, 1, 'a', 1, 0},
		"duplicate node":      {1, 8, 2, 1, 'a', 1, 1, 'a', 1, 2, 0, 0, 1, 0, 0, 1, 1, 0},
		"node out of order":   {1, 8, 2, 1, 'a', 1, 1, 'b', 1, 2, 0, 1, 1, 0, 0, 0, 1, 0},
		"partition range":     {1, 8, 1, 1, 'a', 1, 1, 8, 0, 1, 0},
		"gap wraps around":    {1, 8, 1, 1, 'a', 1, 2, 3, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 1, 0},
		"unknown flag":        {1, 8, 1, 1, 'a', 1, 1, 0, 0, 1, 4},
		"zero MAC":            append([]byte{1, 8, 1, 1, 'a', 1, 1, 0, 0, 1, 1}, make([]byte, ownership.MACSize)...),
		"zero token":          {1, 8, 1, 0, 0, 1, 0, 0, 0, 0},
	}
	for name, b := range cases {
		if _, err := UnmarshalRegister(b); !errors.Is(err, ownership.ErrMalformedToken) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The same cases, repaired, decode: the rejections above are for the
	// stated reason.
	for name, b := range map[string][]byte{
		"one node":  {1, 8, 1, 1, 'a', 1, 1, 0, 0, 1, 0},
		"two nodes": {1, 8, 2, 1, 'a', 1, 1, 'b', 1, 2, 0, 0, 1, 0, 0, 1, 1, 0},
		"MAC":       append([]byte{1, 8, 1, 1, 'a', 1, 1, 0, 0, 1, 1}, bytes.Repeat([]byte{1}, ownership.MACSize)...),
	} {
		if _, err := UnmarshalRegister(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzUnmarshalRegister(f *testing.F) {
	seed, _ := NewRegister(8)
	seed.ObserveClaim(Claim{Token: memTok(1, 3, "a")})
	seed.ObserveClaim(Claim{Token: memTok(4, 2, "b"), Released: true})
	seed.Observe(ownership.Token{Partition: 7, Epoch: 9, Owner: "a", Incarnation: 21, MAC: [ownership.MACSize]byte{7}})
	b, _ := seed.MarshalBinary()
	f.Add(b)
	empty, _ := NewRegister(3)
	b, _ = empty.MarshalBinary()
	f.Add(b)
	f.Add([]byte{1, 8, 2, 1, 'a', 1, 1, 'b', 1, 2, 0, 0, 1, 0, 0, 1, 1, 0})
	f.Add([]byte{1, 0x80, 0x80, 4, 0, 0}) // 65,536 partitions, no claim
	f.Fuzz(func(t *testing.T, b []byte) {
		// For a node of 8 partitions: another count is refused before
		// anything sized by it is allocated.
		parts, claims, err := readClaims(b, 8)
		if !wrongCount(t, err, 8, &parts) && !decodeFailed(t, err) && len(claims) > parts {
			t.Fatalf("%d claims of %d partitions", len(claims), parts)
		}
		r, err := UnmarshalRegister(b)
		if decodeFailed(t, err) {
			return
		}
		again, err := r.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to a register that encodes to %x, %v", b, again, err)
		}
		n := 0
		for c := range r.All() {
			if c.Token.IsZero() || int(c.Token.Partition) >= r.Partitions() || r.GetClaim(c.Token.Partition) != c {
				t.Fatalf("bad claim %v", c)
			}
			n++
		}
		if n != r.Len() {
			t.Fatalf("Len %d, %d claims", r.Len(), n)
		}
	})
}

func FuzzParseClaim(f *testing.F) {
	for _, tok := range codecTokens() {
		b, _ := Claim{Token: tok, Released: true}.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 2, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseClaim(b)
		if decodeFailed(t, err) {
			return
		}
		again, err := c.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %v, which encodes to %x, %v", b, c, again, err)
		}
	})
}

// benchRegister is a register of 1024 partitions owned by 10 nodes.
func benchRegister(b *testing.B, signed bool) *Register {
	r, _ := NewRegister(1024)
	k, _ := ownership.NewKeyring(macTestKey(1))
	for p := range uint32(1024) {
		tok := ownership.Token{Partition: p, Epoch: uint64(p%7) + 1, Owner: fmt.Sprintf("node-%d.example", p%10), Incarnation: 0x9e3779b97f4a7c15 + uint64(p%10)}
		if signed {
			tok = k.Sign(tok)
		}
		r.Observe(tok)
	}
	return r
}

func BenchmarkRegisterMarshal(b *testing.B) {
	for _, signed := range []bool{false, true} {
		b.Run(fmt.Sprintf("partitions=1024/signed=%v", signed), func(b *testing.B) {
			r := benchRegister(b, signed)
			var enc []byte
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if enc, err = r.MarshalBinary(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/state")
		})
	}
}

func BenchmarkUnmarshalRegisterMerge(b *testing.B) {
	r := benchRegister(b, true)
	enc, _ := r.MarshalBinary()
	local := benchRegister(b, true)
	b.ReportAllocs()
	for b.Loop() {
		in, err := UnmarshalRegister(enc)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := local.Merge(in); err != nil {
			b.Fatal(err)
		}
	}
}
