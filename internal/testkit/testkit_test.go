package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
)

// fatalRecorder is a testing.TB whose Fatalf records instead of failing.
type fatalRecorder struct {
	testing.TB
	fatal string
}

func (r *fatalRecorder) Helper()                        {}
func (r *fatalRecorder) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }

// WaitFor returns once the condition holds, and fails the test naming
// what it waited for, with the machine's load and how late the polling ran,
// when the context ends first.
func TestWaitFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &fatalRecorder{TB: t}
	n := 0
	testkit.WaitFor(ctx, r, "three checks", func() bool { n++; return n == 3 })
	if r.fatal != "" || n != 3 {
		t.Fatalf("after %d checks: failed with %q", n, r.fatal)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	testkit.WaitFor(short, r, "nothing", func() bool { return false })
	for _, want := range []string{"waiting for nothing: context deadline exceeded (machine: ", "CPUs, slow factor", "polling ran up to"} {
		if !strings.Contains(r.fatal, want) {
			t.Fatalf("failed with %q, want it to say %q", r.fatal, want)
		}
	}
}

// Ctx's deadline is d scaled by the slow factor, and the context ends
// when the test does.
func TestCtx(t *testing.T) {
	t.Setenv(slowtest.EnvVar, "3")
	var ctx context.Context
	t.Run("inner", func(t *testing.T) {
		ctx = testkit.Ctx(t, 10*time.Second)
		dl, ok := ctx.Deadline()
		if left := time.Until(dl); !ok || left <= 10*time.Second || left > 30*time.Second {
			t.Errorf("Ctx(10s) with %s=3: deadline in %v, want about 30s", slowtest.EnvVar, left)
		}
		if ctx.Err() != nil {
			t.Errorf("Ctx ended before its test: %v", ctx.Err())
		}
	})
	if ctx.Err() != context.Canceled {
		t.Errorf("after its test: Ctx's error %v, want %v", ctx.Err(), context.Canceled)
	}
}

// Check returns nil once its check does, and otherwise the context's
// error with the check's last error and the machine's description.
func TestCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	if err := testkit.Check(ctx, func() error {
		if n++; n < 3 {
			return fmt.Errorf("only %d", n)
		}
		return nil
	}); err != nil || n != 3 {
		t.Fatalf("after %d checks: %v", n, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := testkit.Check(short, func() error { return fmt.Errorf("still %d", 7) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check after its deadline: %v, want %v", err, context.DeadlineExceeded)
	}
	for _, want := range []string{"last: still 7", "(machine: ", "polling ran up to"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Check failed with %q, want it to say %q", err, want)
		}
	}
}
