package browser

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// TestMain runs the tests, prints how many browser checks passed (a figure
// of the whole run, so it is printed after the last test), and checks for
// leaked goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		fmt.Printf("figure: ui.browser_checks %d\n", checks.Load())
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// checks counts the browser checks that passed in this run.
var checks atomic.Int64

// check counts a passed check, or fails t with the message.
func check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
		return
	}
	checks.Add(1)
}

// startCluster starts n coordinators node-0 .. node-<n-1> on loopback with
// a memory fence and waits until each has converged.
func startCluster(t *testing.T, ctx context.Context, n, partitions int, tweak func(*coordinator.Config)) []*coordinator.Coordinator {
	t.Helper()
	fence, err := ownership.NewMemoryFence(partitions)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*coordinator.Coordinator
	for i := range n {
		cfg := coordinator.LocalConfig()
		cfg.Name = fmt.Sprintf("node-%d", i)
		cfg.Ring.Partitions = partitions
		cfg.Handler = coordinator.HandlerFuncs{}
		cfg.Fence = fence
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		if tweak != nil {
			tweak(&cfg)
		}
		c, err := coordinator.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, c)
	}
	for _, c := range nodes {
		if err := c.WaitConverged(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}
