package coordinator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
)

// Review of issue 19: Leave says its goodbye (pushMeta, which waits until
// memberlist has sent it) and then calls memberlist's Leave, which panics
// ("leave after shutdown") once Close has shut memberlist down. Close may
// be called during a Leave: one that runs while the goodbye goes out must
// make Leave return, not crash the process.
func TestCloseDuringTheGoodbyeDoesNotPanic(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "gb", 2)
	leaver := tc.remove("gb1")
	left := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				left <- fmt.Errorf("Leave panicked: %v", r)
			}
		}()
		left <- leaver.c.Leave(ctx)
	}()
	gone := func() bool {
		leaver.c.metaMu.Lock()
		defer leaver.c.metaMu.Unlock()
		return leaver.c.metaVal.Gone
	}
	for !gone() {
		select {
		case err := <-left:
			t.Fatalf("Leave returned %v before its goodbye was seen", err)
		case <-ctx.Done():
			t.Fatal("no goodbye")
		case <-time.After(time.Millisecond):
		}
	}
	leaver.c.Close()
	select {
	case err := <-left:
		if err != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("Leave with Close during its goodbye: %v, want nil or ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Leave did not return after Close")
	}
}
