package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// Bad usage exits 2 with a message, never a panic.
func TestUsage(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: tenurectl"},
		{[]string{"status"}, "no node address"},
		{[]string{"-addr", "127.0.0.1:1", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"-addr", "127.0.0.1:1", "owner"}, "at least one key"},
		{[]string{"-addr", "127.0.0.1:1", "owner", "-hex", "zz"}, "not hex"},
		{[]string{"-addr", "127.0.0.1:1", "watch", "-for", "-1s"}, "watch takes"},
		{[]string{"-addr", "127.0.0.1:1", "map", "extra"}, "no arguments"},
		{[]string{"-addr", "127.0.0.1:1", "-timeout", "0", "status"}, "-timeout must be positive"},
		{[]string{"-addr", "127.0.0.1:1", "-ca", "/nonexistent", "status"}, "-ca"},
		{[]string{"-bogus"}, "flag provided but not defined"},
	} {
		code, _, errOut := ctl(ctx, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// listen accepts connections and hands each to handle until the test ends.
func listen(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				go func() { <-done; conn.Close() }()
				handle(conn)
			}()
		}
	}()
	t.Cleanup(func() {
		close(done)
		lis.Close()
		wg.Wait()
	})
	return lis.Addr().String()
}

// hostile is an Ownership server that answers what a test tells it to.
type hostile struct {
	pb.UnimplementedOwnershipServer
	watch []*pb.OwnershipChange
}

func (h *hostile) Watch(_ *pb.WatchRequest, s grpc.ServerStreamingServer[pb.OwnershipChange]) error {
	for _, m := range h.watch {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	<-s.Context().Done()
	return nil
}

func (h *hostile) Lookup(context.Context, *pb.LookupRequest) (*pb.LookupResponse, error) {
	return &pb.LookupResponse{Owner: "evil\x1b[2J\tnode", Partition: 7}, nil
}

// A node that answers garbage, says nothing, serves something else, or
// sends a table it can't have gets a clear error (exit 1), never a panic
// or an endless wait; names with terminal escapes are quoted.
func TestBadNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	garbage := listen(t, func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nnot grpc at all")) })
	silent := listen(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }) // reads, never answers
	other := serve(t, func(grpc.ServiceRegistrar) {})                       // a gRPC server without the Ownership service
	serveHostile := func(msgs ...*pb.OwnershipChange) string {
		return serve(t, func(r grpc.ServiceRegistrar) { pb.RegisterOwnershipServer(r, &hostile{watch: msgs}) })
	}
	po := func(p uint32) *pb.PartitionOwner { return &pb.PartitionOwner{Partition: p, Owner: "a", Epoch: 1} }
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"garbage", []string{"-addr", garbage, "status"}, "Unavailable"},
		{"silent", []string{"-addr", silent, "-timeout", "300ms", "status"}, "DeadlineExceeded"},
		{"silent map", []string{"-addr", silent, "-timeout", "300ms", "map"}, "within 300ms"},
		{"not tenure", []string{"-addr", other, "status"}, "Unimplemented"},
		{"not tenure owner", []string{"-addr", other, "owner", "k"}, "Unimplemented"},
		{"unreachable", []string{"-addr", "127.0.0.1:1", "status"}, "Unavailable"},
		{"zero partitions", []string{"-addr", serveHostile(&pb.OwnershipChange{Snapshot: true}), "map"}, "table of 0 partitions"},
		{"huge table", []string{"-addr", serveHostile(&pb.OwnershipChange{Snapshot: true, PartitionCount: 1 << 31}), "map"}, "table of 2147483648 partitions"},
		{"partition out of range", []string{"-addr", serveHostile(&pb.OwnershipChange{Snapshot: true, PartitionCount: 2, Partitions: []*pb.PartitionOwner{po(0), po(5)}}), "map"}, "partition 5 of a table of 2"},
		{"no snapshot first", []string{"-addr", serveHostile(&pb.OwnershipChange{PartitionCount: 2}), "map"}, "not a snapshot"},
		{"snapshot never complete", []string{"-addr", serveHostile(&pb.OwnershipChange{Snapshot: true, PartitionCount: 3, Partitions: []*pb.PartitionOwner{po(0)}}), "-timeout", "300ms", "map"}, "no complete partition map"},
		{"count changes without snapshot", []string{"-addr", serveHostile(
			&pb.OwnershipChange{Snapshot: true, PartitionCount: 1, Partitions: []*pb.PartitionOwner{po(0)}},
			&pb.OwnershipChange{PartitionCount: 9}), "watch", "-for", "5s"}, "without a snapshot"},
	} {
		code, out, errOut := ctl(ctx, c.args...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, out %q, err %q; want 1 and %q", c.name, code, out, errOut, c.want)
		}
	}
	code, out, _ := ctl(ctx, "-addr", serveHostile(), "owner", "k")
	if code != 0 || !strings.Contains(out, `"evil\x1b[2J\tnode"`) {
		t.Errorf("a name with escapes printed as %q (exit %d)", out, code)
	}
}

// A node that has not started (no table) answers Unavailable for a key
// and never sends a map: both said plainly. A huge table (4096
// partitions) comes through whole.
func TestEmptyAndHugeNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := coordinator.LocalConfig()
	cfg.Name = "idle"
	cfg.Handler = coordinator.HandlerFuncs{}
	idle, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	addr := serveNode(t, idle)
	if code, _, errOut := ctl(ctx, "-addr", addr, "owner", "k"); code != 1 || !strings.Contains(errOut, "Unavailable") {
		t.Errorf("owner on an idle node: %d %q", code, errOut)
	}
	if code, _, errOut := ctl(ctx, "-addr", addr, "-timeout", "300ms", "map"); code != 1 || !strings.Contains(errOut, "has no table yet") {
		t.Errorf("map on an idle node: %d %q", code, errOut)
	}
	if code, out, _ := ctl(ctx, "-addr", addr, "status"); code != 0 || !strings.Contains(out, "no partition table yet") {
		t.Errorf("status on an idle node: %d %q", code, out)
	}

	cl := cluster(t, ctx, tenuretest.Config{Nodes: 1, Partitions: 4096})
	big := serveNode(t, cl.Node("node-0"))
	code, out, errOut := ctl(ctx, "-addr", big, "-json", "map")
	var m struct {
		Partitions []partitionJSON `json:"partitions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || len(m.Partitions) != 4096 {
		t.Fatalf("map of 4096: exit %d, %d partitions, %q", code, len(m.Partitions), errOut)
	}
	if code, out, _ := ctl(ctx, "-addr", big, "map"); code != 0 || !strings.Contains(out, "4096 partitions on 1 owner") || !strings.Contains(out, "0-4095") {
		t.Errorf("map of 4096: %d %q", code, out)
	}
}
