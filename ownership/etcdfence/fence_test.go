package etcdfence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// TestDoOwnCompares: the caller's own conditions go in a nested
// transaction, which runs only under the fence.
func TestDoOwnCompares(t *testing.T) {
	c, f, data := setup(t, etcdfence.Config{})
	ctx := testkit.Ctx(t, 60*time.Second)
	t1 := fencetest.Tok(2, 1, "a", 1)
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
	mustFence(t, f, fencetest.Tok(2, 2, "b", 2))
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
	ctx := testkit.Ctx(t, 60*time.Second)
	t1 := fencetest.Tok(1, 1, "a", 1)
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

func TestUsageErrors(t *testing.T) {
	c, f, _ := setup(t, etcdfence.Config{})
	ctx := testkit.Ctx(t, 60*time.Second)
	if _, err := etcdfence.New(nil, etcdfence.Config{}); err == nil {
		t.Error("New with a nil KV succeeded")
	}
	if _, err := etcdfence.New(c, etcdfence.Config{Prefix: "a\x00b"}); err == nil {
		t.Error("New with a NUL in the prefix succeeded")
	}
	if f2, err := etcdfence.New(c, etcdfence.Config{}); err != nil || f2.Prefix() != etcdfence.DefaultPrefix {
		t.Errorf("default prefix = %q, %v", f2.Prefix(), err)
	}
	for _, bad := range []ownership.Token{{}, fencetest.Tok(1, 0, "a", 1), fencetest.Tok(1, 1, strings.Repeat("x", 256), 1)} {
		if _, err := f.Fence(ctx, bad); err == nil {
			t.Errorf("Fence(%v) succeeded", bad)
		}
		if _, err := f.Do(ctx, bad, ownership.Monotonic); err == nil {
			t.Errorf("Do(%v) succeeded", bad)
		}
	}
	if _, err := f.Do(ctx, fencetest.Tok(1, 1, "a", 1), ownership.Mode(9)); err == nil {
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
	if _, err := f.Do(ctx, fencetest.Tok(5, 1, "a", 1), ownership.Monotonic); !errors.Is(err, ownership.ErrMalformedToken) {
		t.Errorf("Do over a corrupt mark = %v", err)
	}
}

// TestDoRefusedLeavesTheMark: a higher Monotonic write that etcd refuses
// (a key put twice in one transaction) leaves the mark alone and is no
// unknown outcome. (Exact and Monotonic themselves are in the contract
// suite, TestContract.)
func TestDoRefusedLeavesTheMark(t *testing.T) {
	_, f, data := setup(t, etcdfence.Config{})
	ctx := testkit.Ctx(t, 60*time.Second)
	t2, t3 := fencetest.Tok(4, 2, "b", 2), fencetest.Tok(4, 3, "c", 3)
	mustFence(t, f, t2)
	if _, err := f.Do(ctx, t3, ownership.Monotonic, clientv3.OpPut(data+"k", "x"), clientv3.OpPut(data+"k", "y")); err == nil || errors.Is(err, ownership.ErrOutcomeUnknown) {
		t.Fatalf("Do with a put twice = %v, want etcd's refusal", err)
	}
	if cur, _ := f.Current(ctx, 4); !cur.Same(t2) {
		t.Fatalf("a refused write moved the mark to %v", cur)
	}
	resp, err := f.Do(ctx, t3, ownership.Monotonic, clientv3.OpPut(data+"k", "v3"), clientv3.OpGet(data+"k"))
	if err != nil {
		t.Fatalf("higher monotonic write: %v", err)
	}
	if len(resp.Responses) != 2 || string(resp.Responses[1].GetResponseRange().Kvs[0].Value) != "v3" {
		t.Fatalf("Do's answers = %v, want the put's and the get's (v3)", resp.Responses)
	}
}
