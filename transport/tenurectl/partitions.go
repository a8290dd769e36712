package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// maxPartitions bounds what a node may claim its table holds, so a
// garbled answer can't make tenurectl allocate without end.
const maxPartitions = 1 << 20

// partitions is the map as a Watch snapshot gives it.
type partitions struct {
	count  uint32
	owners map[uint32]*pb.PartitionOwner
}

// apply checks one message against what a node may send and records it.
// It reports whether m starts a new snapshot (the count changed).
func (ps *partitions) apply(m *pb.OwnershipChange) (restarted bool, err error) {
	n := m.GetPartitionCount()
	if n == 0 || n > maxPartitions {
		return false, fmt.Errorf("the node sent a table of %d partitions (want 1..%d): not a tenure node, or a broken one", n, maxPartitions)
	}
	if n != ps.count {
		if !m.GetSnapshot() {
			return false, fmt.Errorf("the node changed its partition count to %d without a snapshot", n)
		}
		ps.count, ps.owners, restarted = n, make(map[uint32]*pb.PartitionOwner, n), true
	}
	for _, o := range m.GetPartitions() {
		if o.GetPartition() >= n {
			return restarted, fmt.Errorf("the node sent partition %d of a table of %d", o.GetPartition(), n)
		}
		ps.owners[o.GetPartition()] = o
	}
	return restarted, nil
}

func (ps *partitions) complete() bool { return ps.count > 0 && len(ps.owners) == int(ps.count) }

// openWatch starts a Watch and reads it until the first complete snapshot,
// which must come within c.timeout. The stream lives on under ctx.
func (c *cli) openWatch(ctx context.Context) (grpc.ServerStreamingClient[pb.OwnershipChange], *partitions, error) {
	var timedOut atomic.Bool
	sctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(c.timeout, func() { timedOut.Store(true); cancel() })
	fail := func(err error) (grpc.ServerStreamingClient[pb.OwnershipChange], *partitions, error) {
		timer.Stop()
		cancel()
		if timedOut.Load() {
			return nil, nil, fmt.Errorf("no complete partition map from %s within %v (a node that has no table yet sends none)", c.addr, c.timeout)
		}
		return nil, nil, err
	}
	stream, err := c.client.Watch(sctx, &pb.WatchRequest{})
	if err != nil {
		return fail(c.callError("watch", err))
	}
	ps := &partitions{}
	for !ps.complete() {
		m, err := stream.Recv()
		if err != nil {
			return fail(c.callError("watch", err))
		}
		if ps.count == 0 && !m.GetSnapshot() {
			return fail(errors.New("the node's first message is not a snapshot"))
		}
		if _, err := ps.apply(m); err != nil {
			return fail(err)
		}
	}
	timer.Stop()
	context.AfterFunc(ctx, cancel)
	return stream, ps, nil
}

// partitionJSON is one partition, as -json prints it.
type partitionJSON struct {
	Partition uint32 `json:"partition"`
	Owner     string `json:"owner"`
	Address   string `json:"address"`
	Epoch     uint64 `json:"epoch"`
	Token     string `json:"token"`
}

func toJSON(o *pb.PartitionOwner) partitionJSON {
	return partitionJSON{Partition: o.GetPartition(), Owner: o.GetOwner(), Address: o.GetAddress(), Epoch: o.GetEpoch(), Token: o.GetToken()}
}

// partitionMap prints the partition map: by owner with ranges, or one row
// per partition with -rows.
func (c *cli) partitionMap(ctx context.Context, args []string) error {
	var rows bool
	fs, err := subFlags("map", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&rows, "rows", false, "one row per partition")
	})
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: map takes no arguments", errUsage)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, ps, err := c.openWatch(ctx)
	if err != nil {
		return err
	}
	sorted := make([]*pb.PartitionOwner, ps.count)
	for p, o := range ps.owners {
		sorted[p] = o
	}
	if c.json {
		out := struct {
			PartitionCount uint32          `json:"partition_count"`
			Partitions     []partitionJSON `json:"partitions"`
		}{ps.count, make([]partitionJSON, 0, len(sorted))}
		for _, o := range sorted {
			out.Partitions = append(out.Partitions, toJSON(o))
		}
		return printJSON(c.out, out)
	}
	if rows {
		t := newTable(c.out, "PARTITION", "OWNER", "ADDRESS", "EPOCH")
		for _, o := range sorted {
			t.row(fmt.Sprint(o.GetPartition()), o.GetOwner(), o.GetAddress(), epochText(o.GetEpoch()))
		}
		return t.flush()
	}
	type group struct {
		addr       string
		parts      []uint32
		handingOff int
	}
	byOwner := map[string]*group{}
	for _, o := range sorted {
		g := byOwner[o.GetOwner()]
		if g == nil {
			g = &group{addr: o.GetAddress()}
			byOwner[o.GetOwner()] = g
		}
		g.parts = append(g.parts, o.GetPartition())
		if o.GetEpoch() == 0 {
			g.handingOff++
		}
	}
	names := make([]string, 0, len(byOwner))
	for n := range byOwner {
		names = append(names, n)
	}
	slices.Sort(names)
	owners := "owners"
	if len(names) == 1 {
		owners = "owner"
	}
	fmt.Fprintf(c.out, "%d partitions on %d %s\n", ps.count, len(names), owners)
	t := newTable(c.out, "OWNER", "ADDRESS", "PARTITIONS", "SHARE", "MOVING", "WHICH")
	for _, n := range names {
		g := byOwner[n]
		which := ranges(g.parts)
		if len(which) > 60 {
			which = which[:57] + "..."
		}
		t.row(n, g.addr, fmt.Sprint(len(g.parts)), fmt.Sprintf("%.1f%%", 100*float64(len(g.parts))/float64(ps.count)),
			fmt.Sprint(g.handingOff), which)
	}
	return t.flush()
}

func epochText(e uint64) string {
	if e == 0 {
		return "- (moving)"
	}
	return fmt.Sprint(e)
}
