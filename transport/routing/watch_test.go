package routing

import (
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// countingSource counts the partitions a Watch reads; it hides the
// source's StatusSince.
type countingSource struct {
	OwnershipSource
	reads atomic.Int64
}

func (s *countingSource) OwnerOfPartition(p uint32) (ownership.OwnerInfo, error) {
	s.reads.Add(1)
	return s.OwnershipSource.OwnerOfPartition(p)
}

// deltaSource is a countingSource that passes StatusSince on, counted.
type deltaSource struct {
	*countingSource
	deltas StatusDeltas
	asked  atomic.Int64
}

func (s *deltaSource) StatusSince(v string) coordinator.StatusDelta {
	s.asked.Add(1)
	return s.deltas.StatusSince(v)
}

// startWatch starts a Watch of src and reads its snapshot.
func startWatch(t *testing.T, src OwnershipSource) (grpc.ServerStreamingClient[pb.OwnershipChange], map[uint32]*pb.PartitionOwner) {
	t.Helper()
	svc, err := NewOwnershipService(OwnershipServiceConfig{Source: src, PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	n.serve("solo", func(s *grpc.Server) { svc.Register(s) })
	w, err := pb.NewOwnershipClient(directConn(t, n, "solo")).Watch(testkit.Ctx(t, 20*time.Second), &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	if err != nil || !snap.GetSnapshot() || len(snap.GetPartitions()) != testPartitions {
		t.Fatalf("snapshot %v: %v", snap, err)
	}
	owners := map[uint32]*pb.PartitionOwner{}
	for _, o := range snap.GetPartitions() {
		owners[o.GetPartition()] = o
	}
	return w, owners
}

// A Watch on a source that reports deltas reads every partition once, for
// its snapshot, and then only what changed: polls of an idle node read
// none. The negative control: the same node without StatusSince is
// re-read whole at every poll.
func TestWatchReadsOnlyChanges(t *testing.T) {
	c := singleNode(t, "solo", nil)
	ctx := testkit.Ctx(t, 20*time.Second)

	plain := &countingSource{OwnershipSource: c}
	startWatch(t, plain)
	tenuretest.WaitFor(ctx, t, "a plain source re-read on polls", func() bool {
		return plain.reads.Load() >= 4*testPartitions
	})

	src := &deltaSource{countingSource: &countingSource{OwnershipSource: c}, deltas: c}
	startWatch(t, src)
	after := src.reads.Load()
	asked := src.asked.Load()
	tenuretest.WaitFor(ctx, t, "ten polls", func() bool { return src.asked.Load() >= asked+10 })
	if n := src.reads.Load() - after; n != 0 {
		t.Fatalf("ten polls of an idle node read %d partitions", n)
	}
}

// A Watch on deltas follows a join to the end: every partition the
// joiner takes arrives with its new owner, address and token, without the
// stream ending.
func TestWatchFollowsJoinByDeltas(t *testing.T) {
	a := singleNode(t, "svc-a", nil)
	src := &deltaSource{countingSource: &countingSource{OwnershipSource: a}, deltas: a}
	w, owners := startWatch(t, src)
	ctx := testkit.Ctx(t, 30*time.Second)

	cfg := coordConfig("b")
	cfg.ServiceAddr = "svc-b"
	cfg.Seeds = []string{a.GossipAddr()}
	b, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tenuretest.WaitFor(ctx, t, "a's table to take b in", func() bool { return len(a.Table().Members()) == 2 })
	if err := a.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	done := func() bool {
		for p := range uint32(testPartitions) {
			want, err := a.OwnerOfPartition(p)
			o := owners[p]
			if err != nil || o == nil || o.GetOwner() != want.Node || o.GetAddress() != want.Addr || o.GetToken() != tokenText(want.Token) {
				return false
			}
		}
		return true
	}
	for !done() {
		m, err := w.Recv()
		if err != nil {
			for p := range uint32(testPartitions) {
				want, _ := a.OwnerOfPartition(p)
				t.Logf("partition %d: watch %v, node %+v", p, owners[p], want)
			}
			t.Fatalf("the watch ended before it showed the join: %v", err)
		}
		for _, o := range m.GetPartitions() {
			owners[o.GetPartition()] = o
		}
	}
	moved := 0
	for _, o := range owners {
		if o.GetOwner() == "b" && o.GetAddress() == "svc-b" && o.GetToken() != "" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no partition moved to b")
	}
	if n := src.reads.Load(); n >= 3*testPartitions {
		t.Fatalf("the watch read %d partitions: it rescanned", n)
	}
}
