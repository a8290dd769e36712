package fencetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// A Subject is one fence under test, fresh for the test that asked for
// it: no partition fenced, no key written.
type Subject struct {
	// Fence is the fence under test. Required.
	Fence ownership.Fence
	// Current returns partition p's mark: the zero token (of any
	// partition) if p was never fenced. Required.
	Current func(ctx context.Context, p uint32) (ownership.Token, error)
	// Write sets key to value in one fenced operation that applies only
	// if t passes the fence in mode m (the fence's Do): nil if it
	// applied, else the fence's error (a *ownership.StaleTokenError, an
	// error wrapping ownership.ErrNotFenced, ...) and nothing written.
	// Keys are short ASCII strings; values are never empty. Required.
	Write func(ctx context.Context, t ownership.Token, m ownership.Mode, key, value string) error
	// Read returns key's value, "" if no write of it applied. Required.
	Read func(ctx context.Context, key string) (string, error)
	// Authority mints tokens on the same marks (a claim is a fence).
	// Required if Config.Strict, and then strict; otherwise ignored.
	Authority ownership.Authority
}

// Config says how to make the fences the suite tests.
type Config struct {
	// New returns a fresh Subject whose fence takes partitions 0 to 15 at
	// least, releasing what it opened with t.Cleanup. It is called once
	// per test, from tests running in parallel. Required.
	New func(t testing.TB) Subject
	// NewKeyed, if not nil, returns a fresh Subject whose fence verifies
	// every token with keys (failing with an error wrapping
	// ownership.ErrBadMAC, before anything else) and signs with keys the
	// mark of every stale answer (as Verifier and Signer do for the SQL
	// and etcd fences, and a Keyring for the memory fence). Default nil:
	// the tests of authentication and signed marks do not run.
	NewKeyed func(t testing.TB, keys *ownership.Keyring) Subject
	// Strict says that every Subject's Authority is strict (S4): the
	// suite checks its claims. Default false: the authority tests do not
	// run.
	Strict bool
}

// timeout bounds each test of the suite.
const timeout = time.Minute

// Run runs the contract suite against the fences cfg makes, each test as
// a parallel subtest of t.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.New == nil {
		t.Fatal("fencetest: Config.New is nil")
	}
	tests := []test{
		{"Advance", testAdvance},
		{"Exact", testExact},
		{"Monotonic", testMonotonic},
		{"BadInput", testBadInput},
		{"ConcurrentFences", testConcurrentFences},
		{"ConcurrentWriters/exact", func(t *testing.T, s *suite) { testConcurrentWriters(t, s, ownership.Exact) }},
		{"ConcurrentWriters/monotonic", func(t *testing.T, s *suite) { testConcurrentWriters(t, s, ownership.Monotonic) }},
	}
	if cfg.Strict {
		tests = append(tests,
			test{"Authority", testAuthority},
			test{"StrictClaims", testStrictClaims})
	}
	if cfg.NewKeyed != nil {
		tests = append(tests,
			test{"Verifier", testVerifier},
			test{"SignedStaleAnswers", testSignedStaleAnswers})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			t.Cleanup(cancel)
			tc.run(t, &suite{cfg: cfg, ctx: ctx})
		})
	}
}

// test is one test of the suite.
type test struct {
	name string
	run  func(*testing.T, *suite)
}

// suite is what one test of the suite works with.
type suite struct {
	cfg Config
	ctx context.Context
}

// fresh returns a new Subject, checked for its required fields.
func (s *suite) fresh(t *testing.T) Subject {
	t.Helper()
	return s.check(t, s.cfg.New(t))
}

func (s *suite) keyed(t *testing.T) (Subject, *ownership.Keyring) {
	t.Helper()
	keys, err := ownership.NewKeyring(ownership.Key("fencetest-key-0123456789abcdef01"))
	if err != nil {
		t.Fatal(err)
	}
	return s.check(t, s.cfg.NewKeyed(t, keys)), keys
}

// authority returns a new Subject with a strict Authority.
func (s *suite) authority(t *testing.T) Subject {
	t.Helper()
	x := s.fresh(t)
	if x.Authority == nil || !x.Authority.Strict() {
		t.Fatal("fencetest: Config.Strict, but the Subject has no strict Authority")
	}
	return x
}

func (s *suite) check(t *testing.T, x Subject) Subject {
	t.Helper()
	if x.Fence == nil || x.Current == nil || x.Write == nil || x.Read == nil {
		t.Fatal("fencetest: the Subject lacks Fence, Current, Write or Read")
	}
	return x
}

// Tok returns the token of partition p at epoch held by owner's
// incarnation inc.
func Tok(p uint32, epoch uint64, owner string, inc uint64) ownership.Token {
	return ownership.Token{Partition: p, Epoch: epoch, Owner: owner, Incarnation: inc}
}

// fence fences x with tk, which must become (or be) the mark.
func (s *suite) fence(t *testing.T, x Subject, tk ownership.Token) {
	t.Helper()
	if got, err := x.Fence.Fence(s.ctx, tk); err != nil || !got.Same(tk) {
		t.Fatalf("Fence(%v) = %v, %v; want %v", tk, got, err, tk)
	}
}

// mark fails unless partition p's mark is want.
func (s *suite) mark(t *testing.T, x Subject, p uint32, want ownership.Token) {
	t.Helper()
	cur, err := x.Current(s.ctx, p)
	if err != nil {
		t.Fatalf("Current(%d): %v", p, err)
	}
	if want.IsZero() && cur.IsZero() || cur.Same(want) {
		return
	}
	t.Fatalf("mark of p%d = %v, want %v", p, cur, want)
}

// read fails unless key holds want.
func (s *suite) read(t *testing.T, x Subject, key, want string) {
	t.Helper()
	got, err := x.Read(s.ctx, key)
	if err != nil {
		t.Fatalf("Read(%q): %v", key, err)
	}
	if got != want {
		t.Fatalf("%q = %q, want %q", key, got, want)
	}
}

// WantStale fails t unless err is a *ownership.StaleTokenError carrying
// current.
func WantStale(t testing.TB, err error, current ownership.Token) {
	t.Helper()
	se, ok := errors.AsType[*ownership.StaleTokenError](err)
	if !errors.Is(err, ownership.ErrStaleToken) || !ok {
		t.Fatalf("error %v, want a *StaleTokenError", err)
	}
	if !se.Current.Same(current) {
		t.Fatalf("stale answer carries %v, want %v", se.Current, current)
	}
}

func wantNotFenced(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ownership.ErrNotFenced) {
		t.Fatalf("%s = %v, want ErrNotFenced", what, err)
	}
}

func key(parts ...any) string { return fmt.Sprint(parts...) }
