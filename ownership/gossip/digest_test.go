package gossip

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/internal/wire"
)

func TestRangeBounds(t *testing.T) {
	for _, parts := range []int{1, 2, 31, 32, 33, 64, 271, 4096, 8192, MaxPartitions} {
		n := Ranges(parts)
		if n != min(parts, DigestRanges) {
			t.Fatalf("Ranges(%d) = %d", parts, n)
		}
		next := uint32(0)
		small, big := parts, 0
		for i := range n {
			lo, hi := RangeBounds(parts, i)
			if lo != next || hi <= lo {
				t.Fatalf("%d partitions: range %d is [%d, %d), want it to start at %d and hold one or more", parts, i, lo, hi, next)
			}
			small, big = min(small, int(hi-lo)), max(big, int(hi-lo))
			for _, p := range []uint32{lo, (lo + hi) / 2, hi - 1} {
				if got := RangeOf(parts, p); got != i {
					t.Fatalf("%d partitions: RangeOf(%d) = %d, want %d", parts, p, got, i)
				}
			}
			next = hi
		}
		if int(next) != parts || big-small > 1 {
			t.Fatalf("%d partitions: ranges end at %d, sizes %d to %d", parts, next, small, big)
		}
		if RangeOf(parts, uint32(parts)) != -1 {
			t.Fatalf("%d partitions: RangeOf(%d) in range", parts, parts)
		}
	}
	for _, parts := range []int{0, -1, MaxPartitions + 1} {
		if Ranges(parts) != 0 || RangeOf(parts, 0) != -1 {
			t.Fatalf("%d partitions: %d ranges", parts, Ranges(parts))
		}
	}
}

// randomRegister fills a register of parts partitions with claims drawn
// from a small space (so two registers share many claims).
func randomRegister(t testing.TB, rng *rand.Rand, parts, claims int) *Register {
	r, err := NewRegister(parts)
	if err != nil {
		t.Fatal(err)
	}
	for range claims {
		tok := ownership.Token{
			Partition: uint32(rng.IntN(parts)), Epoch: uint64(1 + rng.IntN(3)),
			Owner: fmt.Sprint("n", rng.IntN(3)), Incarnation: uint64(1 + rng.IntN(2)),
		}
		if rng.IntN(4) == 0 {
			tok.MAC[rng.IntN(ownership.MACSize)] = byte(1 + rng.IntN(2))
		}
		r.ObserveClaim(Claim{Token: tok, Released: rng.IntN(3) == 0})
	}
	return r
}

// The naive reference: a range differs exactly when one of its
// partitions holds different claims (MACs included).
func TestDigestDiffAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		parts := []int{1, 5, 32, 40, 271, 1000}[trial%6]
		a := randomRegister(t, rng, parts, rng.IntN(2*parts))
		b := randomRegister(t, rng, parts, rng.IntN(2*parts))
		if trial%3 == 0 {
			b, _ = UnmarshalRegister(must(a.MarshalBinary()))
			if parts > 1 {
				b.ObserveClaim(Claim{Token: ownership.Token{Partition: uint32(rng.IntN(parts)), Epoch: 9, Owner: "z"}})
			}
		}
		var want []int
		for p := range uint32(parts) {
			if a.GetClaim(p) != b.GetClaim(p) {
				if r := RangeOf(parts, p); len(want) == 0 || want[len(want)-1] != r {
					want = append(want, r)
				}
			}
		}
		got, err := a.Digest().Diff(b.Digest())
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("trial %d (%d partitions): Diff = %v, %v; want %v", trial, parts, got, err, want)
		}
		if a.Digest().Equal(b.Digest()) != (len(want) == 0) {
			t.Fatalf("trial %d: Equal disagrees with Diff %v", trial, want)
		}
	}
	x, _ := NewRegister(8)
	y, _ := NewRegister(9)
	if _, err := x.Digest().Diff(y.Digest()); err == nil {
		t.Fatal("digests of 8 and 9 partitions compared")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// The digest is cached per change of the register: after a change it is
// the digest of the new claims, and what a caller does to a returned
// digest does not reach the cache.
func TestDigestFollowsChanges(t *testing.T) {
	r, _ := NewRegister(271)
	d0 := r.Digest()
	d0.Hashes[0] = 1
	if !r.Digest().Equal(digestOf(make([]Claim, 271))) {
		t.Fatal("a caller's write reached the cached digest")
	}
	r.Observe(memTok(100, 1, "a"))
	d1 := r.Digest()
	if d1.Equal(digestOf(make([]Claim, 271))) || !d1.Equal(digestOf(r.claims)) {
		t.Fatal("the digest did not follow a new claim")
	}
	r.Observe(memTok(100, 1, "a")) // no change
	r.ObserveClaim(Claim{Token: memTok(100, 1, "a"), Released: true})
	if d2 := r.Digest(); d2.Equal(d1) || !d2.Equal(digestOf(r.claims)) {
		t.Fatal("the digest did not follow a release")
	}
	// Changes between calls, a few at a time: the cached digest, whose
	// changed ranges alone are hashed again, equals one computed whole.
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 500 {
		for range rng.IntN(4) {
			r.Observe(memTok(uint32(rng.IntN(271)), uint64(2+i), fmt.Sprint("n", rng.IntN(3))))
		}
		if !r.Digest().Equal(digestOf(r.claims)) {
			t.Fatalf("step %d: the cached digest differs from the whole one", i)
		}
	}
}

// The exchange itself: a's sections of the ranges that differ, merged by
// b, and b's answers, merged by a, leave them equal, whatever the split
// into sections; the answer holds only claims above a's.
func TestSectionsAndAnswersConverge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		parts := []int{1, 7, 32, 271, 1000}[trial%5]
		a := randomRegister(t, rng, parts, rng.IntN(2*parts))
		b := randomRegister(t, rng, parts, rng.IntN(2*parts))
		diff, err := a.Digest().Diff(b.Digest())
		if err != nil {
			t.Fatal(err)
		}
		maxClaims := 1 + rng.IntN(40)
		for _, s := range a.Sections(diff, maxClaims) {
			if err := s.Validate(); err != nil || !s.Ask {
				t.Fatalf("a section %+v: %v", s, err)
			}
			if len(s.Ranges) > 1 && len(s.Claims) > maxClaims {
				t.Fatalf("a section of %d ranges and %d claims, at most %d", len(s.Ranges), len(s.Claims), maxClaims)
			}
			// The answer is computed before or after the merge: the same.
			before := b.Answer(s, maxClaims)
			for _, c := range s.Claims {
				b.ObserveClaim(c)
			}
			after := b.Answer(s, maxClaims)
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("answer before the merge %v, after %v", before, after)
			}
			theirs := map[uint32]Claim{}
			for _, c := range s.Claims {
				theirs[c.Token.Partition] = c
			}
			for _, ans := range after {
				if err := ans.Validate(); err != nil || ans.Ask || len(ans.Claims) > maxClaims {
					t.Fatalf("an answer %+v: %v", ans, err)
				}
				for _, c := range ans.Claims {
					if !ranksAbove(c, theirs[c.Token.Partition]) {
						t.Fatalf("answer claim %v not above %v", c, theirs[c.Token.Partition])
					}
					a.ObserveClaim(c)
				}
			}
		}
		if !bytes.Equal(must(a.MarshalBinary()), must(b.MarshalBinary())) {
			d, _ := a.Digest().Diff(b.Digest())
			t.Fatalf("trial %d (%d partitions): registers differ after the exchange, ranges %v", trial, parts, d)
		}
	}
}

func TestSectionValidate(t *testing.T) {
	c := func(p uint32) Claim { return Claim{Token: memTok(p, 1, "a")} }
	bad := map[string]Section{
		"no partitions":    {Partitions: 0, Ranges: []int{0}},
		"no ranges":        {Partitions: 8},
		"range of none":    {Partitions: 8, Ranges: []int{8}},
		"ranges unordered": {Partitions: 8, Ranges: []int{2, 1}},
		"ranges repeated":  {Partitions: 8, Ranges: []int{1, 1}},
		"claim outside":    {Partitions: 8, Ranges: []int{1, 2}, Claims: []Claim{c(3)}},
		"claims unordered": {Partitions: 8, Ranges: []int{1, 2}, Claims: []Claim{c(2), c(1)}},
		"zero claim":       {Partitions: 8, Ranges: []int{0}, Claims: []Claim{{}}},
	}
	for name, s := range bad {
		if s.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		if _, err := (Message{Kind: KindSection, Sender: "a", Section: s}).Seal(nil); err == nil {
			t.Errorf("%s: sealed", name)
		}
		r, _ := NewRegister(8)
		r.Observe(memTok(1, 5, "b"))
		if got := r.Answer(s, 10); got != nil {
			t.Errorf("%s: answered %v", name, got)
		}
	}
	ok := Section{Partitions: 271, Ranges: []int{0, 5}, Claims: []Claim{c(0), c(7), c(5 * 271 / 32)}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

// FuzzSection: a section's body decodes to a valid section that encodes
// back to the same bytes, or fails with ErrMalformedToken; decoded for a
// node of want partitions (not zero), a section of another count fails
// with ErrPartitionRange.
func FuzzSection(f *testing.F) {
	r, _ := NewRegister(271)
	for p := range uint32(271) {
		r.Observe(memTok(p, uint64(p%3+1), fmt.Sprint("n", p%4)))
	}
	for _, s := range append(r.Sections([]int{0, 3, 31}, 20), Section{Partitions: 1, Ranges: []int{0}}) {
		f.Add(appendSection(nil, s), uint32(0))
		f.Add(appendSection(nil, s), uint32(271))
	}
	f.Fuzz(func(t *testing.T, b []byte, want uint32) {
		s, err := parseSection(b, int(want%(MaxPartitions+1)))
		if wrongCount(t, err, want, &s.Partitions) || decodeFailed(t, err) {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded an invalid section: %v", err)
		}
		if again := appendSection(nil, s); !bytes.Equal(again, b) {
			t.Fatalf("not canonical: %x decoded, %x encoded", b, again)
		}
	})
}

// FuzzDigest: a digest body decodes to a digest of the right shape that
// encodes back to the same bytes, or fails with ErrMalformedToken.
func FuzzDigest(f *testing.F) {
	r, _ := NewRegister(4096)
	r.Observe(memTok(5, 1, "a"))
	for _, d := range []Digest{r.Digest(), digestOf(make([]Claim, 3))} {
		f.Add(appendDigest(nil, d), uint32(0))
		f.Add(appendDigest(nil, d), uint32(4096))
	}
	f.Fuzz(func(t *testing.T, b []byte, want uint32) {
		d := wire.Decoder{B: b}
		dec, err := readDigest(&d, int(want%(MaxPartitions+1)))
		if err == nil {
			err = d.End()
		}
		if wrongCount(t, err, want, &dec.Partitions) || decodeFailed(t, err) {
			return
		}
		if len(dec.Hashes) != Ranges(dec.Partitions) || Ranges(dec.Partitions) == 0 {
			t.Fatalf("digest of %d hashes for %d partitions", len(dec.Hashes), dec.Partitions)
		}
		if again := appendDigest(nil, dec); !bytes.Equal(again, b) {
			t.Fatalf("not canonical: %x decoded, %x encoded", b, again)
		}
	})
}

// BenchmarkDigest: the digest of a full register, computed whole (the
// first call), after one claim changed (a busy node's push/pull), and
// cached (a quiet node's).
func BenchmarkDigest(b *testing.B) {
	for _, parts := range []int{271, 4096, 65536} {
		r, _ := NewRegister(parts)
		for p := range uint32(parts) {
			r.Observe(ownership.Token{Partition: p, Epoch: 3, Owner: fmt.Sprint("node-", p%50), Incarnation: 99, MAC: [ownership.MACSize]byte{1}})
		}
		b.Run(fmt.Sprintf("whole/%d", parts), func(b *testing.B) {
			for range b.N {
				r.mu.Lock()
				r.digest.Hashes = nil
				r.mu.Unlock()
				r.Digest()
			}
		})
		b.Run(fmt.Sprintf("one-changed/%d", parts), func(b *testing.B) {
			for i := range b.N {
				r.Observe(ownership.Token{Partition: uint32(i % parts), Epoch: uint64(4 + i), Owner: "x", Incarnation: 1})
				r.Digest()
			}
		})
		b.Run(fmt.Sprintf("cached/%d", parts), func(b *testing.B) {
			for range b.N {
				r.Digest()
			}
		})
	}
}
