package routing

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// OwnershipSource is what the ownership service reads;
// *coordinator.Coordinator implements it. Every method is called
// concurrently and must not block.
type OwnershipSource interface {
	Owner(key []byte) (ownership.OwnerInfo, error)
	OwnerOfPartition(p uint32) (ownership.OwnerInfo, error)
	Table() *ring.Table
	Subscribe(buf int) (<-chan coordinator.Event, func())
	// Status is the node's status page as data; it may take time in
	// proportion to the partition count.
	Status() coordinator.Status
}

// OwnershipServiceConfig configures an OwnershipService.
type OwnershipServiceConfig struct {
	// Source is the node's coordinator. Required.
	Source OwnershipSource
	// PollInterval is how often a Watch looks for changed owners besides
	// on each coordinator event: the tokens of other nodes' claims arrive
	// by gossip without an event. Default 250 ms. Shorter intervals report
	// claims sooner. With a source that reports what changed (StatusSince,
	// as *coordinator.Coordinator does) a poll re-reads only the changed
	// partitions, and the node reads its table at most once per 50 ms for
	// all watchers; with any other source each poll of each watcher
	// re-reads every partition.
	PollInterval time.Duration
	// MaxBatch is the most partitions one Watch message lists; a larger
	// snapshot or change spans several messages. Default 4096.
	MaxBatch int
}

// Validate reports the first problem with c. It does not change c.
func (c OwnershipServiceConfig) Validate() error {
	switch {
	case c.Source == nil:
		return errors.New("transport: OwnershipServiceConfig.Source is nil")
	case c.PollInterval < 0 || c.MaxBatch < 0:
		return errors.New("transport: OwnershipServiceConfig.PollInterval and MaxBatch must not be negative")
	}
	return nil
}

// OwnershipService serves tenure.ownership.v1.Ownership (see
// transport/ownershippb): Lookup tells who owns a key, Watch streams every
// partition's owner and then its changes, Status reports the node's health, so programs in any language can
// route by key or run beside a node as a sidecar. It answers from the
// node's own view, which may lag the cluster's by a gossip round: callers
// follow not-owner answers as a Router does.
//
// Register it on the node's gRPC server; DefaultExempt keeps the guards
// away from it.
type OwnershipService struct {
	pb.UnimplementedOwnershipServer
	src   OwnershipSource
	poll  time.Duration
	batch int
}

// NewOwnershipService returns the service for cfg.
func NewOwnershipService(cfg OwnershipServiceConfig) (*OwnershipService, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &OwnershipService{src: cfg.Source, poll: cfg.PollInterval, batch: cfg.MaxBatch}
	if s.poll == 0 {
		s.poll = 250 * time.Millisecond
	}
	if s.batch == 0 {
		s.batch = 4096
	}
	return s, nil
}

// Register registers the service on r.
func (s *OwnershipService) Register(r grpc.ServiceRegistrar) {
	pb.RegisterOwnershipServer(r, s)
}

// Lookup answers the owner of req's key.
func (s *OwnershipService) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	if err := transport.CheckKey(req.GetKey()); err != nil {
		return nil, err
	}
	o, err := s.src.Owner(req.GetKey())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "tenure: no owner: %v", err)
	}
	return &pb.LookupResponse{
		Owner:     o.Node,
		Address:   o.Addr,
		Partition: o.Partition,
		Token:     tokenText(o.Token),
		Epoch:     o.Token.Epoch,
	}, nil
}

// Status answers the node's health and members (coordinator.Status
// without the partition rows, which Watch streams).
func (s *OwnershipService) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := s.src.Status()
	resp := &pb.StatusResponse{
		Node: st.Node, Cluster: st.Cluster, Incarnation: st.Incarnation, Started: st.Started,
		Converged: st.Converged, Quorum: st.Quorum, Stable: st.Stable, Leaving: st.Leaving,
		StaleRejections: st.StaleRejections, PartitionCount: uint32(st.PartitionCount), Owned: uint32(st.Owned),
		NoQuorum: st.NoQuorum, StableVersion: st.StableVersion,
	}
	for _, m := range st.Members {
		resp.Members = append(resp.Members, &pb.MemberStatus{
			Name: m.Name, GossipAddr: m.GossipAddr, ServiceAddr: m.ServiceAddr, Self: m.Self,
			Held: uint32(m.Held), RingShare: uint32(m.RingShare), FairShare: m.FairShare,
		})
	}
	for _, p := range st.Partitions {
		switch p.State {
		case coordinator.StateMoving:
			resp.Moving++
		case coordinator.StateElsewhere:
			resp.Elsewhere++
		case coordinator.StateUnowned:
			resp.Unowned++
		}
	}
	return resp, nil
}

// StatusDeltas is a source that reports what changed in its Status since
// a version; *coordinator.Coordinator is one. A Watch on such a source
// re-reads only the partitions that changed.
type StatusDeltas interface {
	StatusSince(version string) coordinator.StatusDelta
}

// Watch streams the owners of every partition, then their changes.
func (s *OwnershipService) Watch(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.OwnershipChange]) error {
	ctx := stream.Context()
	events, cancel := s.src.Subscribe(16)
	defer cancel()
	tick := time.NewTicker(s.poll)
	defer tick.Stop()

	w := &watcher{svc: s}
	w.deltas, _ = s.src.(StatusDeltas)
	update := func(all bool) error {
		t := s.src.Table()
		if t == nil {
			return nil
		}
		snapshot, n, changed := w.changes(t.Partitions(), all)
		return s.send(stream, snapshot, n, changed)
	}
	for {
		if err := update(false); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case _, ok := <-events:
			if !ok {
				// The node is closing: its last releases may have landed
				// after the last scan. Send them, then end.
				if err := update(true); err != nil {
					return err
				}
				return status.Error(codes.Unavailable, "tenure: the node is shutting down")
			}
		case <-tick.C:
		}
	}
}

// watcher is one Watch's view of the owners it sent.
type watcher struct {
	svc     *OwnershipService
	deltas  StatusDeltas         // nil: re-read every partition each time
	last    []*pb.PartitionOwner // by partition; nil until the first snapshot
	version string               // of the status last read from deltas
	addrs   map[string]string    // member -> service address, as last read
}

// changes re-reads what may have changed in a table of n partitions (all
// of it: every partition) and returns the owners that did, and whether
// they are a new snapshot.
func (w *watcher) changes(n int, all bool) (snapshot bool, count uint32, changed []*pb.PartitionOwner) {
	snapshot = len(w.last) != n
	todo := w.todo(n)
	if all || snapshot || todo == nil {
		cur := w.svc.scan(n)
		for p, o := range cur {
			if snapshot || !samePartitionOwner(w.last[p], o) {
				changed = append(changed, o)
			}
		}
		w.last = cur
		return snapshot, uint32(n), changed
	}
	for _, p := range todo {
		if o := w.svc.read(p); !samePartitionOwner(w.last[p], o) {
			changed = append(changed, o)
			w.last[p] = o
		}
	}
	return false, uint32(n), changed
}

// todo lists the partitions whose owner may have changed since the last
// call: those whose row in the node's status changed, and those owned by
// a member whose address changed. nil: any of them (no deltas, or the
// node sent its whole status).
func (w *watcher) todo(n int) []uint32 {
	if w.deltas == nil {
		return nil
	}
	d := w.deltas.StatusSince(w.version)
	w.version = d.Version
	if d.Full || d.PartitionCount != n || len(w.last) != n {
		w.addrs = map[string]string{}
		for _, m := range d.Members {
			w.addrs[m.Name] = m.ServiceAddr
		}
		return nil
	}
	todo := []uint32{}
	for _, p := range d.Partitions {
		todo = append(todo, p.Partition)
	}
	moved := map[string]bool{}
	for _, m := range d.Members {
		if a, ok := w.addrs[m.Name]; !ok || a != m.ServiceAddr {
			w.addrs[m.Name], moved[m.Name] = m.ServiceAddr, true
		}
	}
	for _, name := range d.RemovedMembers {
		delete(w.addrs, name)
		moved[name] = true
	}
	if len(moved) > 0 {
		for p, o := range w.last {
			if moved[o.GetOwner()] {
				todo = append(todo, uint32(p))
			}
		}
	}
	return todo
}

// scan reads every partition's owner.
func (s *OwnershipService) scan(n int) []*pb.PartitionOwner {
	out := make([]*pb.PartitionOwner, n)
	for p := range out {
		out[p] = s.read(uint32(p))
	}
	return out
}

// read reads partition p's owner.
func (s *OwnershipService) read(p uint32) *pb.PartitionOwner {
	o := &pb.PartitionOwner{Partition: p}
	if info, err := s.src.OwnerOfPartition(p); err == nil {
		o.Owner, o.Address, o.Token, o.Epoch = info.Node, info.Addr, tokenText(info.Token), info.Token.Epoch
	}
	return o
}

func (s *OwnershipService) send(stream grpc.ServerStreamingServer[pb.OwnershipChange], snapshot bool, n uint32, parts []*pb.PartitionOwner) error {
	for len(parts) > 0 {
		k := min(len(parts), s.batch)
		if err := stream.Send(&pb.OwnershipChange{Snapshot: snapshot, PartitionCount: n, Partitions: parts[:k]}); err != nil {
			return err
		}
		parts = parts[k:]
	}
	return nil
}

func samePartitionOwner(a, b *pb.PartitionOwner) bool {
	return a.GetOwner() == b.GetOwner() && a.GetAddress() == b.GetAddress() &&
		a.GetToken() == b.GetToken() && a.GetEpoch() == b.GetEpoch()
}

// tokenText is t's text form, or "" for the zero token.
func tokenText(t ownership.Token) string {
	if t.IsZero() {
		return ""
	}
	b, err := t.MarshalText()
	if err != nil {
		return ""
	}
	return string(b)
}
