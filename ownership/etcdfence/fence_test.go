package etcdfence_test

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
)

func TestFenceAdvances(t *testing.T) {
	_, f, _ := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	if got, err := f.Current(ctx, 7); err != nil || !got.IsZero() || got.Partition != 7 {
		t.Fatalf("Current of an unfenced partition = %v, %v; want the zero token of p7", got, err)
	}
	t1, t2 := tok(7, 1, "a", 1), tok(7, 2, "b", 2)
	for _, step := range []struct {
		fence, want ownership.Token
		stale       bool
	}{
		{fence: t1, want: t1},
		{fence: t1, want: t1}, // refence: a no-op
		{fence: t2, want: t2},
		{fence: t1, want: t2, stale: true},
		{fence: tok(7, 2, "a", 9), want: t2, stale: true}, // same epoch, lower owner
		{fence: t2, want: t2},
	} {
		mark, err := f.Fence(ctx, step.fence)
		if step.stale {
			wantStale(t, err, step.want)
		} else if err != nil {
			t.Fatalf("Fence(%v): %v", step.fence, err)
		}
		if !mark.Same(step.want) {
			t.Fatalf("Fence(%v) = %v, want %v", step.fence, mark, step.want)
		}
		if cur, err := f.Current(ctx, 7); err != nil || !cur.Same(step.want) {
			t.Fatalf("Current after Fence(%v) = %v, %v; want %v", step.fence, cur, err, step.want)
		}
	}
	if got, err := f.Fence(ctx, tok(8, 1, "a", 1)); err != nil || !got.Same(tok(8, 1, "a", 1)) {
		t.Fatalf("Fence on p8 = %v, %v", got, err)
	}
}

func TestDoExact(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	put := func(tk ownership.Token, v string) error {
		_, err := f.Do(ctx, tk, ownership.Exact, clientv3.OpPut(data+"k", v))
		return err
	}
	t1, t2, t3 := tok(3, 1, "a", 1), tok(3, 2, "b", 2), tok(3, 3, "c", 3)
	if err := put(t1, "v0"); !errors.Is(err, ownership.ErrNotFenced) {
		t.Fatalf("Exact write to an unfenced partition = %v, want ErrNotFenced", err)
	}
	mustFence(t, f, t1)
	if err := put(t1, "v1"); err != nil {
		t.Fatalf("write under the mark: %v", err)
	}
	mustFence(t, f, t2)
	wantStale(t, put(t1, "late"), t2)
	if err := put(t3, "unfenced"); !errors.Is(err, ownership.ErrNotFenced) {
		t.Fatalf("Exact write above the mark = %v, want ErrNotFenced", err)
	}
	resp, err := f.Do(ctx, t2, ownership.Exact, clientv3.OpPut(data+"k", "v2"), clientv3.OpGet(data+"k"))
	if err != nil {
		t.Fatalf("write under the new mark: %v", err)
	}
	if len(resp.Responses) != 2 || string(resp.Responses[1].GetResponseRange().Kvs[0].Value) != "v2" {
		t.Fatalf("Do's answers = %v, want the put's and the get's (v2)", resp.Responses)
	}
	if got := get(t, c, data+"k"); got != "v2" {
		t.Fatalf("k = %q, want v2", got)
	}
	if cur, _ := f.Current(ctx, 3); !cur.Same(t2) {
		t.Fatalf("Exact writes moved the mark to %v", cur)
	}
}

func TestDoMonotonic(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	put := func(tk ownership.Token, m ownership.Mode, v string) error {
		resp, err := f.Do(ctx, tk, m, clientv3.OpPut(data+"k", v))
		if err == nil && len(resp.Responses) != 1 {
			t.Fatalf("Do answered %d ops, want 1", len(resp.Responses))
		}
		return err
	}
	t1, t2, t3 := tok(4, 1, "a", 1), tok(4, 2, "b", 2), tok(4, 3, "c", 3)
	if err := put(t2, ownership.Monotonic, "v2"); err != nil {
		t.Fatalf("first monotonic write: %v", err)
	}
	if cur, _ := f.Current(ctx, 4); !cur.Same(t2) {
		t.Fatalf("mark after the first write = %v, want %v", cur, t2)
	}
	wantStale(t, put(t1, ownership.Monotonic, "old"), t2)
	if _, err := f.Fence(ctx, t1); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("Fence below a monotonic write: %v", err)
	}
	// A higher write that etcd refuses (a key put twice in one
	// transaction) leaves the mark alone.
	if _, err := f.Do(ctx, t3, ownership.Monotonic, clientv3.OpPut(data+"k", "x"), clientv3.OpPut(data+"k", "y")); err == nil || errors.Is(err, ownership.ErrOutcomeUnknown) {
		t.Fatalf("Do with a put twice = %v, want etcd's refusal", err)
	}
	if cur, _ := f.Current(ctx, 4); !cur.Same(t2) {
		t.Fatalf("a refused write moved the mark to %v", cur)
	}
	if err := put(t3, ownership.Monotonic, "v3"); err != nil {
		t.Fatalf("higher monotonic write: %v", err)
	}
	if cur, _ := f.Current(ctx, 4); !cur.Same(t3) {
		t.Fatalf("mark after the higher write = %v, want %v", cur, t3)
	}
	wantStale(t, put(t2, ownership.Exact, "old"), t3)
	if got := get(t, c, data+"k"); got != "v3" {
		t.Fatalf("k = %q, want v3", got)
	}
}

// TestDoOwnCompares: the caller's own conditions go in a nested
// transaction, which runs only under the fence.
func TestDoOwnCompares(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	t1 := tok(2, 1, "a", 1)
	mustFence(t, f, t1)
	cas := func(tk ownership.Token, old, v string) (bool, error) {
		resp, err := f.Do(ctx, tk, ownership.Exact, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(data+"k"), "=", old)},
			[]clientv3.Op{clientv3.OpPut(data+"k", v)}, nil))
		if err != nil {
			return false, err
		}
		return resp.Responses[0].GetResponseTxn().Succeeded, nil
	}
	if _, err := c.Put(ctx, data+"k", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := cas(t1, "a", "b"); !ok || err != nil {
		t.Fatalf("cas a->b = %v, %v", ok, err)
	}
	if ok, err := cas(t1, "a", "c"); ok || err != nil {
		t.Fatalf("cas a->c after a->b = %v, %v; want false", ok, err)
	}
	mustFence(t, f, tok(2, 2, "b", 2))
	if _, err := cas(t1, "b", "stale"); !errors.Is(err, ownership.ErrStaleToken) {
		t.Fatalf("cas under a stale token = %v", err)
	}
	if got := get(t, c, data+"k"); got != "b" {
		t.Fatalf("k = %q, want b", got)
	}
}

// TestDoRefusesMarkWrites: ops may read the marks but not write them, in
// any form: a stale owner that could delete or overwrite its partition's
// mark in the transaction its check runs in could then fence itself back
// in.
func TestDoRefusesMarkWrites(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	t1 := tok(1, 1, "a", 1)
	mustFence(t, f, t1)
	fk := f.Prefix() + "p/1"
	before := strings.TrimSuffix(f.Prefix(), "/")
	for _, op := range []clientv3.Op{
		clientv3.OpPut(fk, "x"),
		clientv3.OpDelete(fk),
		clientv3.OpDelete(f.Prefix(), clientv3.WithPrefix()),
		clientv3.OpDelete("", clientv3.WithFromKey()),
		clientv3.OpDelete(before, clientv3.WithRange(f.Prefix()+"q")),
		clientv3.OpDelete("a", clientv3.WithFromKey()),
		clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(data+"ok", "x")}, []clientv3.Op{clientv3.OpDelete(fk)}),
	} {
		if _, err := f.Do(ctx, t1, ownership.Exact, op); err == nil {
			t.Errorf("Do with an op writing %q (to %q) succeeded", op.KeyBytes(), op.RangeBytes())
		}
	}
	for _, op := range []clientv3.Op{
		clientv3.OpGet(f.Prefix(), clientv3.WithPrefix()),
		clientv3.OpPut(data+"k", "v"),
		clientv3.OpDelete(data, clientv3.WithPrefix()),
		clientv3.OpDelete(before, clientv3.WithRange(f.Prefix())), // ends where the marks begin
		clientv3.OpDelete(clientv3.GetPrefixRangeEnd(f.Prefix()), clientv3.WithFromKey()),
	} {
		if _, err := f.Do(ctx, t1, ownership.Exact, op); err != nil {
			t.Errorf("Do with an op on %q (to %q): %v", op.KeyBytes(), op.RangeBytes(), err)
		}
	}
	if cur, err := f.Current(ctx, 1); err != nil || !cur.Same(t1) {
		t.Fatalf("mark = %v, %v; want %v", cur, err, t1)
	}
	_ = c
}

func TestVerifier(t *testing.T) {
	keys, err := ownership.NewKeyring(ownership.Key("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	_, f, data := setup(t, etcdfence.Config{Verifier: keys})
	ctx := testContext(t)
	good := keys.Sign(tok(1, 1, "good", 1))
	forged := good
	forged.Epoch = 1 << 40
	for _, bad := range []ownership.Token{tok(1, 1<<40, "evil", 1), forged} {
		if _, err := f.Fence(ctx, bad); !errors.Is(err, ownership.ErrBadMAC) {
			t.Fatalf("Fence(%v) = %v, want ErrBadMAC", bad, err)
		}
		if _, err := f.Do(ctx, bad, ownership.Monotonic, clientv3.OpPut(data+"k", "x")); !errors.Is(err, ownership.ErrBadMAC) {
			t.Fatalf("Do(%v) = %v, want ErrBadMAC", bad, err)
		}
	}
	if cur, _ := f.Current(ctx, 1); !cur.IsZero() {
		t.Fatalf("an unauthentic token was fenced: mark %v", cur)
	}
	mustFence(t, f, good)
	if _, err := f.Do(ctx, good, ownership.Exact); err != nil {
		t.Fatalf("Do with a signed token: %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	c, f, _ := setup(t, etcdfence.Config{})
	ctx := testContext(t)
	if _, err := etcdfence.New(nil, etcdfence.Config{}); err == nil {
		t.Error("New with a nil KV succeeded")
	}
	if _, err := etcdfence.New(c, etcdfence.Config{Prefix: "a\x00b"}); err == nil {
		t.Error("New with a NUL in the prefix succeeded")
	}
	if f2, err := etcdfence.New(c, etcdfence.Config{}); err != nil || f2.Prefix() != etcdfence.DefaultPrefix {
		t.Errorf("default prefix = %q, %v", f2.Prefix(), err)
	}
	for _, bad := range []ownership.Token{{}, tok(1, 0, "a", 1), tok(1, 1, strings.Repeat("x", 256), 1)} {
		if _, err := f.Fence(ctx, bad); err == nil {
			t.Errorf("Fence(%v) succeeded", bad)
		}
		if _, err := f.Do(ctx, bad, ownership.Monotonic); err == nil {
			t.Errorf("Do(%v) succeeded", bad)
		}
	}
	if _, err := f.Do(ctx, tok(1, 1, "a", 1), ownership.Mode(9)); err == nil {
		t.Error("Do with an unknown mode succeeded")
	}
	if cur, _ := f.Current(ctx, 1); !cur.IsZero() {
		t.Errorf("rejected calls fenced %v", cur)
	}
	// A corrupt mark is an error, never a token.
	if _, err := c.Put(ctx, f.Prefix()+"p/5", "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Current(ctx, 5); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("Current of a corrupt mark = %v", err)
	}
	if _, err := f.Do(ctx, tok(5, 1, "a", 1), ownership.Monotonic); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("Do over a corrupt mark = %v", err)
	}
}

// Issue 11, defect 2: a keyed cluster believes a stale answer's current
// token only with a valid MAC, and marks are kept without theirs: with a
// Signer, every stale answer (Fence's and Do's) carries a signed mark.
func TestSignerSignsStaleAnswers(t *testing.T) {
	keys, err := ownership.NewKeyring(ownership.Key("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	_, f, data := setup(t, etcdfence.Config{Verifier: keys, Signer: keys})
	ctx := testContext(t)
	low, high := keys.Sign(tok(1, 1, "a", 1)), keys.Sign(tok(1, 2, "b", 1))
	mustFence(t, f, high)
	mark, ferr := f.Fence(ctx, low)
	_, derr := f.Do(ctx, low, ownership.Exact, clientv3.OpPut(data+"k", "x"))
	for what, err := range map[string]error{"Fence": ferr, "Do": derr} {
		var st *ownership.StaleTokenError
		if !errors.As(err, &st) {
			t.Fatalf("%s under a lower token: %v, want stale", what, err)
		}
		if st.Current.Compare(high) != 0 || keys.Verify(st.Current) != nil {
			t.Fatalf("%s's stale answer names %v (%v), want %v signed", what, st.Current, keys.Verify(st.Current), high)
		}
	}
	if keys.Verify(mark) != nil {
		t.Fatalf("Fence returned an unsigned mark %v", mark)
	}
}
