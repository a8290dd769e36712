//go:build unix

package main

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs the test binary as a kvstore node when the demo starts it
// as one (the demo starts its own executable), and checks for leaked
// goroutines otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNode(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// TestDemoShort runs the demo's short mode: five child processes, a
// SIGSTOP past the lease, a SIGKILL and restart, a network cut and heal,
// and a graceful leave, under a concurrent workload. It fails if an
// acknowledged write was lost or a stale write was accepted.
func TestDemoShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := config{
		nodes: 5, partitions: 32, writers: 8, keys: 32,
		phase: 300 * time.Millisecond, pause: 4 * time.Second, cut: 4 * time.Second, timeout: 6 * time.Second,
		dir: t.TempDir(),
	}
	ok, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("the demo found a lost acknowledged write or an accepted stale write (see its report above)")
	}
}
