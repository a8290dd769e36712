package coordinator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// The timing rule of coordinator/TIMING.md: with Grace above StepDown plus
// the spread of failure detection, an owner cut off from the rest ends its
// leases before the majority fences its partitions. The spread is the
// catch: an isolated node's own probes all fail, memberlist's Lifeguard
// then slows its failure detector down, and it went on counting the others
// (and serving) after the majority had claimed its partitions (leases ended
// 3.45-3.5 s after the cut, partitions fenced at 2.3-2.7 s, with the local
// preset). These tests hold the order: the isolated owner's last lease ends
// before the majority's first fence of a partition it held.

// TestIsolatedOwnerStepsDownBeforeTheMajorityFences isolates an owner of a
// 5-node cluster running the local preset.
func TestIsolatedOwnerStepsDownBeforeTheMajorityFences(t *testing.T) {
	lastEnd, firstFence := isolateAnOwner(t, nil)
	t.Logf("after the cut: the isolated owner's last lease ended at %v, the majority's first fence of its partitions at %v", lastEnd, firstFence)
}

// TestIsolatedOwnerStepsDownFirstDespiteLifeguard is the same with a
// failure detector Lifeguard slows down further on a troubled node (larger
// suspicion and awareness multipliers, as a LAN-tuned config has): the
// isolated node's member list keeps the others for longer than Grace, so
// only its own reach check can end its leases in time.
func TestIsolatedOwnerStepsDownFirstDespiteLifeguard(t *testing.T) {
	lastEnd, firstFence := isolateAnOwner(t, func(c *Config) {
		ml := *c.Memberlist
		ml.SuspicionMaxTimeoutMult = 6
		ml.AwarenessMaxMultiplier = 8
		c.Memberlist = &ml
	})
	t.Logf("after the cut: the isolated owner's last lease ended at %v, the majority's first fence of its partitions at %v", lastEnd, firstFence)
}

// isolateAnOwner starts 5 nodes, isolates one, waits until the majority
// owns every partition again and the isolated node none, and fails the
// test unless the isolated node's last Release came before the first fence
// of one of its partitions by another node. It returns both, measured from
// the cut.
func isolateAnOwner(t *testing.T, tweak func(*Config)) (lastEnd, firstFence time.Duration) {
	t.Helper()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const victim = "i4"
	rec := &orderRecorder{victim: victim, held: map[uint32]bool{}}
	tc, fn := faultCluster(t, func(c *Config) {
		if tweak != nil {
			tweak(c)
		}
		c.Fence = &recordingFence{inner: c.Fence, rec: rec}
		if c.Name == victim {
			c.Handler = &recordingHandler{Handler: c.Handler, rec: rec}
		}
	})
	tc.startNodes(ctx, "i", 5)
	var majority []*testNode
	for _, n := range tc.all() {
		if n.name != victim {
			majority = append(majority, n)
		}
	}
	rec.cut(tc.fence)
	if len(rec.held) == 0 {
		t.Fatalf("%s holds no partition", victim)
	}
	fn.Isolate(victim)
	// The reach check shows in Status: the isolated node names members it
	// can't ping before its leases end.
	named := false
	testkit.WaitFor(ctx, t, "the isolated owner to end its leases", func() bool {
		named = named || len(tc.node(victim).c.Status().Unreachable) > 0
		return tc.node(victim).c.ownedCount() == 0
	})
	if !named {
		t.Errorf("%s's Status never named an unreachable member before its leases ended", victim)
	}
	tc.waitConvergedAmong(ctx, majority)
	lastEnd, firstFence, err := rec.order()
	if err != nil {
		t.Fatal(err)
	}
	return lastEnd, firstFence
}

// orderRecorder keeps, from the cut on, the isolated node's last Release
// and the first fence of one of its partitions by another node.
type orderRecorder struct {
	victim string
	mu     sync.Mutex
	at     time.Time // the cut; zero before it
	held   map[uint32]bool
	end    time.Time // last Release on the victim
	fenced time.Time // first fence by another node of a partition in held
}

func (r *orderRecorder) cut(f *ownership.MemoryFence) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range testPartitions {
		if f.Current(uint32(p)).Owner == r.victim {
			r.held[uint32(p)] = true
		}
	}
	r.at = time.Now()
}

func (r *orderRecorder) released() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() {
		r.end = time.Now()
	}
}

func (r *orderRecorder) fencing(t ownership.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && r.fenced.IsZero() && t.Owner != r.victim && r.held[t.Partition] {
		r.fenced = time.Now()
	}
}

func (r *orderRecorder) order() (lastEnd, firstFence time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end.IsZero() || r.fenced.IsZero() {
		return 0, 0, fmt.Errorf("incomplete record: last release %v, first fence %v", r.end, r.fenced)
	}
	lastEnd, firstFence = r.end.Sub(r.at), r.fenced.Sub(r.at)
	if !r.end.Before(r.fenced) {
		return lastEnd, firstFence, fmt.Errorf("the isolated owner ended its last lease %v after the cut, after the majority fenced one of its partitions (%v)", lastEnd, firstFence)
	}
	return lastEnd, firstFence, nil
}

type recordingFence struct {
	inner ownership.Fence
	rec   *orderRecorder
}

func (f *recordingFence) Fence(ctx context.Context, t ownership.Token) (ownership.Token, error) {
	f.rec.fencing(t)
	return f.inner.Fence(ctx, t)
}

type recordingHandler struct {
	Handler
	rec *orderRecorder
}

func (h *recordingHandler) Release(ctx context.Context, l *ownership.Lease) error {
	h.rec.released()
	return h.Handler.Release(ctx, l)
}
