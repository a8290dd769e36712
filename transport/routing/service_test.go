package routing

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

func TestHealthReportsLeaving(t *testing.T) {
	c := singleNode(t, "solo", nil)
	h := NewHealth(c, "tenure.transport.test.KV")
	defer h.Close()
	n := newBufNet(t)
	n.serve("solo", func(s *grpc.Server) { h.Register(s) })
	hc := healthgrpc.NewHealthClient(directConn(t, n, "solo"))
	ctx := testkit.Ctx(t, 20*time.Second)

	for _, svc := range []string{"", "tenure.transport.test.KV"} {
		resp, err := hc.Check(ctx, &healthgrpc.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
			t.Fatalf("%q before leaving: %v %v", svc, resp.GetStatus(), err)
		}
	}
	watch, err := hc.Watch(ctx, &healthgrpc.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", resp.GetStatus(), err)
	}
	if err := c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after leaving: %v %v", resp.GetStatus(), err)
	}
	for _, svc := range []string{"", "tenure.transport.test.KV"} {
		resp, err := hc.Check(ctx, &healthgrpc.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthgrpc.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q after leaving: %v %v", svc, resp.GetStatus(), err)
		}
	}
}

func TestHealthReportsClose(t *testing.T) {
	c := singleNode(t, "solo", nil)
	h := NewHealth(c)
	defer h.Close()
	ctx := testkit.Ctx(t, 10*time.Second)
	if resp, _ := h.Check(ctx, &healthgrpc.HealthCheckRequest{}); resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
		t.Fatal("not serving at start")
	}
	_ = c.Close()
	tenuretest.WaitFor(ctx, t, "NOT_SERVING after Close", func() bool {
		resp, _ := h.Check(ctx, &healthgrpc.HealthCheckRequest{})
		return resp.GetStatus() == healthgrpc.HealthCheckResponse_NOT_SERVING
	})
	h.Close()
	h.Close() // idempotent
}

func TestOwnershipService(t *testing.T) {
	c := singleNode(t, "solo-addr", nil)
	svc, err := NewOwnershipService(OwnershipServiceConfig{Source: c, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	lease := liveLease(t)
	// Behind a guard: the service is exempt and needs no key.
	leases := &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }}
	g, err := NewGuard(GuardConfig{Leases: leases, Stale: leases})
	if err != nil {
		t.Fatal(err)
	}
	n.serve("solo", func(s *grpc.Server) { svc.Register(s) }, g.ServerOptions()...)
	oc := pb.NewOwnershipClient(directConn(t, n, "solo"))
	ctx := testkit.Ctx(t, 20*time.Second)

	resp, err := oc.Lookup(ctx, &pb.LookupRequest{Key: []byte("user-42")})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := c.Owner([]byte("user-42"))
	if resp.GetOwner() != "solo" || resp.GetAddress() != "solo-addr" || resp.GetPartition() != want.Partition || resp.GetEpoch() != want.Token.Epoch {
		t.Fatalf("lookup %v, want %+v", resp, want)
	}
	tok, err := ownership.ParseTokenText(resp.GetToken())
	if err != nil || tok != want.Token {
		t.Fatalf("token %q: %v %v", resp.GetToken(), tok, err)
	}
	for _, key := range [][]byte{nil, make([]byte, transport.MaxKeySize+1)} {
		if _, err := oc.Lookup(ctx, &pb.LookupRequest{Key: key}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("key of %d bytes: %v", len(key), err)
		}
	}

	st, err := oc.Status(ctx, &pb.StatusRequest{})
	if err != nil || st.GetNode() != "solo" || !st.GetStarted() || st.GetPartitionCount() != uint32(c.Table().Partitions()) ||
		len(st.GetMembers()) != 1 || !st.GetMembers()[0].GetSelf() || st.GetMembers()[0].GetHeld() != st.GetPartitionCount() ||
		len(st.GetIncarnation()) != 16 || !st.GetQuorum() || st.GetNoQuorum() != "" || st.GetStableVersion() != c.Status().StableVersion {
		t.Fatalf("status %v: %v", st, err)
	}

	w, err := oc.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !snap.GetSnapshot() || snap.GetPartitionCount() != testPartitions || len(snap.GetPartitions()) != testPartitions {
		t.Fatalf("snapshot: %v", snap)
	}
	for i, p := range snap.GetPartitions() {
		if p.GetPartition() != uint32(i) || p.GetOwner() != "solo" || p.GetEpoch() == 0 {
			t.Fatalf("snapshot partition %d: %v", i, p)
		}
	}
	// Leaving releases every partition: the watch reports the tokens going,
	// then ends when the coordinator closes.
	if err := c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	released := map[uint32]bool{}
	for {
		ch, err := w.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("watch ended with %v", err)
			}
			break
		}
		if ch.GetSnapshot() {
			t.Fatalf("a second snapshot: %v", ch)
		}
		for _, p := range ch.GetPartitions() {
			if p.GetToken() == "" {
				released[p.GetPartition()] = true
			}
		}
	}
	if len(released) != testPartitions {
		t.Fatalf("the watch saw %d of %d partitions released", len(released), testPartitions)
	}
	if _, err := oc.Lookup(ctx, &pb.LookupRequest{Key: []byte("k")}); err != nil {
		// After Close the table remains; either answer is fine, but no panic
		// and a clear status.
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("lookup after close: %v", err)
		}
	}
}

func TestOwnershipServiceBatches(t *testing.T) {
	c := singleNode(t, "solo", nil)
	svc, err := NewOwnershipService(OwnershipServiceConfig{Source: c, MaxBatch: 5})
	if err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	n.serve("solo", func(s *grpc.Server) { svc.Register(s) })
	w, err := pb.NewOwnershipClient(directConn(t, n, "solo")).Watch(testkit.Ctx(t, 10*time.Second), &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for seen < testPartitions {
		ch, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !ch.GetSnapshot() || len(ch.GetPartitions()) > 5 {
			t.Fatalf("batch %v", ch)
		}
		seen += len(ch.GetPartitions())
	}
	if seen != testPartitions {
		t.Fatalf("snapshot of %d partitions", seen)
	}
	if _, err := NewOwnershipService(OwnershipServiceConfig{}); err == nil {
		t.Fatal("a service without a source")
	}
	if _, err := NewOwnershipService(OwnershipServiceConfig{Source: c, PollInterval: -1}); err == nil {
		t.Fatal("a negative poll interval")
	}
}

// noQuorumSource is a node that counts no quorum, and says why.
type noQuorumSource struct{ *coordinator.Coordinator }

func (s noQuorumSource) Status() coordinator.Status {
	st := s.Coordinator.Status()
	st.Quorum, st.NoQuorum, st.StableVersion = false, "reaches 1 of the 3 stable members, not a majority", 7
	return st
}

// The Status call carries why a node has no quorum, and its stable
// membership's version, as the status page does.
func TestStatusSaysWhyNoQuorum(t *testing.T) {
	c := singleNode(t, "solo-addr", nil)
	svc, err := NewOwnershipService(OwnershipServiceConfig{Source: noQuorumSource{c}, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n := newBufNet(t)
	n.serve("solo", func(s *grpc.Server) { svc.Register(s) })
	oc := pb.NewOwnershipClient(directConn(t, n, "solo"))
	ctx := testkit.Ctx(t, 20*time.Second)
	st, err := oc.Status(ctx, &pb.StatusRequest{})
	if err != nil || st.GetQuorum() || st.GetNoQuorum() != "reaches 1 of the 3 stable members, not a majority" || st.GetStableVersion() != 7 {
		t.Fatalf("status %v: %v", st, err)
	}
}
