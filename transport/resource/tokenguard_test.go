package resource

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/transport"
)

func TestTokenGuard(t *testing.T) {
	keys, err := ownership.NewKeyring(ownership.Key(strings.Repeat("s", 32)))
	if err != nil {
		t.Fatal(err)
	}
	fence, err := ownership.NewMemoryFence(8)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Ctx(t, 10*time.Second)
	mark := keys.Sign(fencetest.Tok(3, 5, "b", 1))
	if _, err := fence.Fence(ctx, mark); err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	n.serve("res", TokenGuardConfig{Keyring: keys, Fence: fence, Mode: ownership.Monotonic}, admitted)
	cc := n.conn("res")

	// The current token passes, and the handler sees it.
	got, err := put(transport.WithToken(ctx, mark), cc)
	if err != nil || got != tokenString(t, mark) {
		t.Fatalf("current token: %q %v", got, err)
	}
	// A higher one fences the resource (Monotonic) and passes.
	next := keys.Sign(fencetest.Tok(3, 6, "c", 1))
	if _, err := put(transport.WithToken(ctx, next), cc); err != nil {
		t.Fatalf("next token: %v", err)
	}
	// The old one is now stale: the refusal carries the current token.
	_, err = put(transport.WithToken(ctx, mark), cc)
	st, ok := transport.StaleFromStatus(err)
	if status.Code(err) != codes.FailedPrecondition || !ok || st.Current != next || st.Token != mark {
		t.Fatalf("stale: %v (%+v %v)", err, st, ok)
	}
	// Unsigned, or signed by another key: Unauthenticated.
	if _, err := put(transport.WithToken(ctx, fencetest.Tok(3, 9, "x", 1)), cc); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unsigned: %v", err)
	}
	forged := next
	forged.Epoch = 100
	if _, err := put(transport.WithToken(ctx, forged), cc); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged: %v", err)
	}
	if fence.Current(3) != next {
		t.Fatal("a refused token moved the fence")
	}
	// No token, a malformed, oversized or repeated one: InvalidArgument.
	for name, md := range map[string]metadata.MD{
		"none":      {},
		"malformed": metadata.Pairs(transport.TokenMetadata, "v1.???"),
		"oversized": metadata.Pairs(transport.TokenMetadata, strings.Repeat("A", ownership.MaxTokenTextSize+1)),
		"repeated":  metadata.Pairs(transport.TokenMetadata, tokenString(t, next), transport.TokenMetadata, tokenString(t, next)),
	} {
		if _, err := put(metadata.NewOutgoingContext(ctx, md), cc); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A partition the fence doesn't have.
	if _, err := put(transport.WithToken(ctx, keys.Sign(fencetest.Tok(99, 1, "x", 1))), cc); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("partition out of range: %v", err)
	}
	// Streams carry and check tokens too.
	cs, err := cc.NewStream(transport.WithToken(ctx, next), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	var out wrapperspb.StringValue
	if err := cs.RecvMsg(&out); err != nil || out.GetValue() != tokenString(t, next) {
		t.Fatalf("stream: %q %v", out.GetValue(), err)
	}
	cs, err = cc.NewStream(transport.WithToken(ctx, mark), repeatDesc, methodRepeat)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	if err := cs.RecvMsg(&out); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale stream: %v", err)
	}
}

// With Fence set, the handler's write is atomic with the token's check: a
// newer owner's fence waits until the handler has returned, so a write
// under epoch 1 never lands after epoch 2 was fenced (S1). A check-only
// guard promises no such thing, and the same sequence breaks S1 through it:
// that is the negative control, and why FenceChecker is gone.
func TestFenceHoldsOffNewerFence(t *testing.T) {
	for _, c := range []struct {
		name      string
		cfg       func(*ownership.MemoryFence) TokenGuardConfig
		violation bool
	}{
		{"fence", func(f *ownership.MemoryFence) TokenGuardConfig { return TokenGuardConfig{Fence: f} }, false},
		{"check only", func(f *ownership.MemoryFence) TokenGuardConfig {
			return TokenGuardConfig{Checker: CheckerFunc(func(ctx context.Context, t ownership.Token) error {
				_, err := f.Fence(ctx, t) // what FenceChecker did
				return err
			})}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Ctx(t, 10*time.Second)
			fence, err := ownership.NewMemoryFence(8)
			if err != nil {
				t.Fatal(err)
			}
			e1, e2 := fencetest.Tok(3, 1, "a", 1), fencetest.Tok(3, 2, "b", 1)
			if _, err := fence.Fence(ctx, e1); err != nil {
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			var staleWrites atomic.Int64
			n := newBufNet(t)
			n.serve("res", c.cfg(fence), func(ctx context.Context) (string, error) {
				close(entered)
				<-release
				// The write: it must run under the partition's mark.
				if t, _ := TokenFrom(ctx); !fence.Current(t.Partition).Same(t) {
					staleWrites.Add(1)
				}
				return "written", nil
			})
			done := make(chan error, 1)
			go func() {
				_, err := put(transport.WithToken(ctx, e1), n.conn("res"))
				done <- err
			}()
			<-entered
			// The new owner fences while e1's handler runs. Give the fence
			// a moment to complete (it must not, with Fence set).
			fenced := make(chan error, 1)
			go func() { _, err := fence.Fence(ctx, e2); fenced <- err }()
			early := false
			select {
			case err := <-fenced:
				early = true
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(100 * time.Millisecond):
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !early {
				if err := <-fenced; err != nil {
					t.Fatal(err)
				}
			}
			if got := staleWrites.Load() > 0; got != c.violation || early != c.violation {
				t.Fatalf("write under e1 after e2 was fenced: %v (fence completed during the handler: %v); want %v", got, early, c.violation)
			}
			// Either way the old token is refused from now on.
			if _, err := put(transport.WithToken(ctx, e1), n.conn("res")); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("e1 after e2's fence: %v", err)
			}
		})
	}
}

func TestTokenGuardErrors(t *testing.T) {
	n := newBufNet(t)
	var answer, handlerErr error
	n.serve("check", TokenGuardConfig{Checker: CheckerFunc(func(context.Context, ownership.Token) error { return answer })},
		func(context.Context) (string, error) { return "ok", handlerErr })
	fence, err := ownership.NewMemoryFence(8)
	if err != nil {
		t.Fatal(err)
	}
	n.serve("fenced", TokenGuardConfig{Fence: fence}, func(context.Context) (string, error) { return "ok", handlerErr })
	ctx := transport.WithToken(testkit.Ctx(t, 10*time.Second), fencetest.Tok(3, 1, "a", 1))
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{nil, codes.OK},
		{ownership.ErrNotFenced, codes.FailedPrecondition},
		{ownership.ErrConflict, codes.Aborted},
		{errors.New("database down"), codes.Unavailable},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
	} {
		answer = tc.err
		if _, err := put(ctx, n.conn("check")); status.Code(err) != tc.code {
			t.Errorf("checker %v: %v, want %v", tc.err, err, tc.code)
		}
	}
	answer = nil
	// The fence judges in Exact mode by default: an unfenced token is
	// refused, and the handler does not run.
	if _, err := put(ctx, n.conn("fenced")); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("unfenced token: %v", err)
	}
	if _, err := fence.Fence(ctx, fencetest.Tok(3, 1, "a", 1)); err != nil {
		t.Fatal(err)
	}
	// The handler's errors are converted, through the fence or not.
	for _, addr := range []string{"check", "fenced"} {
		handlerErr = ownership.Stale(fencetest.Tok(3, 1, "a", 1), fencetest.Tok(3, 2, "b", 1))
		if _, err := put(ctx, n.conn(addr)); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: handler's stale error: %v", addr, err)
		}
		handlerErr = ownership.ErrOutcomeUnknown
		if _, err := put(ctx, n.conn(addr)); !transport.IsOutcomeUnknown(err) {
			t.Errorf("%s: handler's unknown outcome: %v", addr, err)
		}
	}
	if err := (TokenGuardConfig{Mode: 7}).Validate(); err == nil {
		t.Error("mode 7 is valid")
	}
}

// A resource's handler that calls a further resource with its own context
// passes the admitted token on.
func TestTokenPassesOn(t *testing.T) {
	n := newBufNet(t)
	n.serve("last", TokenGuardConfig{}, admitted)
	last := n.conn("last")
	n.serve("first", TokenGuardConfig{}, func(ctx context.Context) (string, error) { return put(ctx, last) })
	e1 := fencetest.Tok(3, 1, "a", 1)
	got, err := put(transport.WithToken(testkit.Ctx(t, 10*time.Second), e1), n.conn("first"))
	if err != nil || got != tokenString(t, e1) {
		t.Fatalf("the last resource saw %q, %v; want %q", got, err, tokenString(t, e1))
	}
	// Without WithToken, no token is sent.
	if _, err := put(testkit.Ctx(t, 10*time.Second), last); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no token: %v", err)
	}
	// An unencodable token fails on the client.
	bad := e1
	bad.Owner = strings.Repeat("x", 300)
	if _, err := put(transport.WithToken(testkit.Ctx(t, 10*time.Second), bad), last); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unencodable: %v", err)
	}
}

// A resource server that only checks tokens builds without the cluster:
// neither the coordinator nor memberlist nor Prometheus is among this
// package's dependencies (nor the routing side's). The routing side, which
// does need them, is the check's negative control.
func TestImportsNoCluster(t *testing.T) {
	banned := func(pkg string) []string {
		out, err := exec.CommandContext(testkit.Ctx(t, time.Minute), "go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		var found []string
		for _, d := range strings.Fields(string(out)) {
			for _, b := range []string{"/coordinator", "hashicorp/memberlist", "prometheus", "/transport/routing"} {
				if strings.Contains(d, b) {
					found = append(found, d)
				}
			}
		}
		return found
	}
	if found := banned("."); len(found) != 0 {
		t.Errorf("resource depends on %v", found)
	}
	if found := banned("github.com/tenure-go/tenure/transport"); len(found) != 0 {
		t.Errorf("transport depends on %v", found)
	}
	if found := banned("github.com/tenure-go/tenure/transport/routing"); len(found) == 0 {
		t.Error("the check finds no cluster package even in transport/routing")
	}
}
