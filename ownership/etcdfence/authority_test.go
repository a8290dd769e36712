package etcdfence_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// TestAuthorityUsageErrors: the etcd authority is strict, and a claim by
// a node without a name or with one too long, or from a token of another
// partition or an epoch that can't be raised, is a usage error, never a
// conflict, and changes nothing. (The claims themselves are in the
// contract suite, TestContract.)
func TestAuthorityUsageErrors(t *testing.T) {
	_, f, _ := setup(t, etcdfence.Config{})
	a := f.Authority()
	ctx := testkit.Ctx(t, 60*time.Second)
	if !a.Strict() {
		t.Fatal("the etcd authority is not strict")
	}
	na := ownership.Node{Name: "a", Incarnation: 1 << 63}
	tc, err := a.Claim(ctx, 9, na, ownership.Token{})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		n    ownership.Node
		seen ownership.Token
	}{
		{ownership.Node{}, tc},
		{ownership.Node{Name: strings.Repeat("x", 256)}, tc},
		{na, fencetest.Tok(8, 3, "a", 1<<63)},
		{na, fencetest.Tok(9, math.MaxUint64, "b", 5)},
	} {
		if got, err := a.Claim(ctx, 9, bad.n, bad.seen); err == nil || errors.Is(err, ownership.ErrConflict) {
			t.Fatalf("Claim(%v, %v) = %v, %v; want a usage error", bad.n, bad.seen, got, err)
		}
	}
	if cur, _ := f.Current(ctx, 9); !cur.Same(tc) {
		t.Fatalf("mark = %v, want %v", cur, tc)
	}
}
