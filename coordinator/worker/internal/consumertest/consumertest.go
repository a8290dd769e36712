package consumertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
)

// Hold blocks a node's batches after they are read and before they are
// committed while it is frozen: the handler side of a paused process.
type Hold struct {
	mu      sync.Mutex
	frozen  chan struct{} // nil: not frozen
	Blocked atomic.Int32  // batches waiting now
}

// Freeze makes the batches that reach Wait from now on wait.
func (h *Hold) Freeze() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.frozen = make(chan struct{})
}

// Thaw lets the waiting batches go on.
func (h *Hold) Thaw() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.frozen != nil {
		close(h.frozen)
		h.frozen = nil
	}
}

// Wait is where a batch waits, between its read and its commit, while h
// is frozen.
func (h *Hold) Wait() {
	h.mu.Lock()
	ch := h.frozen
	h.mu.Unlock()
	if ch != nil {
		h.Blocked.Add(1)
		<-ch // not the batch's ctx: a stopped process does not notice either
		h.Blocked.Add(-1)
	}
}

// Consumers is a tenuretest cluster whose nodes run a Runtime each.
type Consumers struct {
	Cl    *tenuretest.Cluster
	Holds map[string]*Hold // per node name
	mu    sync.Mutex
	rts   map[string]*worker.Runtime // the latest of each node
	all   []*worker.Runtime          // every one, to close
}

// Start starts the cluster of cfg (whose Handler and Bind it sets), each
// node's handler a Runtime from newRuntime, closed when the test ends.
// newRuntime gets the node's Hold, for its batches to wait at.
func Start(t *testing.T, ctx context.Context, cfg tenuretest.Config, newRuntime func(h *Hold) (*worker.Runtime, error)) *Consumers {
	t.Helper()
	cs := &Consumers{rts: map[string]*worker.Runtime{}, Holds: map[string]*Hold{}}
	for i := range cfg.Nodes {
		cs.Holds[fmt.Sprintf("node-%d", i)] = &Hold{}
	}
	cfg.Handler = func(name string) coordinator.Handler {
		rt, err := newRuntime(cs.Holds[name])
		if err != nil {
			panic(err) // a test bug: the config is the test's
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		cs.rts[name] = rt
		cs.all = append(cs.all, rt)
		return rt
	}
	cfg.Bind = func(name string, c *coordinator.Coordinator) { cs.RT(name).Bind(c) }
	cl, err := tenuretest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs.Cl = cl
	t.Cleanup(cs.Close)
	return cs
}

// RT is node name's latest Runtime.
func (cs *Consumers) RT(name string) *worker.Runtime {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.rts[name]
}

// Close thaws every Hold, closes the cluster and then every Runtime.
func (cs *Consumers) Close() {
	for _, h := range cs.Holds {
		h.Thaw()
	}
	cs.Cl.Close()
	cs.mu.Lock()
	all := cs.all
	cs.mu.Unlock()
	for _, rt := range all {
		rt.Close()
	}
}
