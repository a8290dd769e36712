package browser

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
)

// TestMain runs the tests, prints how many browser checks passed (a figure
// of the whole run, so it is printed after the last test), and checks for
// leaked goroutines.
func TestMain(m *testing.M) {
	tenuretest.VerifyTestMain(&countingM{m})
}

// countingM prints the checks figure once the tests passed.
type countingM struct{ *testing.M }

func (m *countingM) Run() int {
	code := m.M.Run()
	if code == 0 {
		fmt.Printf("figure: ui.browser_checks %d\n", checks.Load())
	}
	return code
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

// startCluster starts n nodes node-0 .. node-<n-1> with the harness and
// returns their coordinators.
func startCluster(t *testing.T, ctx context.Context, n, partitions int, tweak func(*coordinator.Config)) []*coordinator.Coordinator {
	t.Helper()
	cl, err := tenuretest.Start(ctx, tenuretest.Config{Nodes: n, Partitions: partitions, Tweak: tweak})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	var nodes []*coordinator.Coordinator
	for _, name := range cl.Live() {
		nodes = append(nodes, cl.Node(name))
	}
	return nodes
}
