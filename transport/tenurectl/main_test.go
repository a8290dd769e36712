package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/transport/routing"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }

// serve serves register's services on a loopback listener until the test
// ends and returns the address.
func serve(t *testing.T, register func(grpc.ServiceRegistrar)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// serveNode serves c's Ownership service and returns its address.
func serveNode(t *testing.T, c *coordinator.Coordinator) string {
	t.Helper()
	svc, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: c, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, svc.Register)
}

// ctl runs tenurectl with args and returns its exit status and output.
func ctl(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func cluster(t *testing.T, ctx context.Context, cfg tenuretest.Config) *tenuretest.Cluster {
	t.Helper()
	cl, err := tenuretest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Against a real 3-node cluster: owner, map, status and watch, as tables
// and as JSON, agree with what the nodes report; a crash shows in watch.
func TestAgainstCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := cluster(t, ctx, tenuretest.Config{})
	addr := serveNode(t, cl.Node("node-0"))

	owner, err := cl.OwnerOf(ctx, []byte("user-42"))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctl(ctx, "-addr", addr, "owner", "user-42")
	if code != 0 || !strings.Contains(out, "user-42") || !strings.Contains(out, owner) || !strings.HasPrefix(out, "KEY") {
		t.Fatalf("owner: %d %q %q", code, out, errOut)
	}
	code, out, _ = ctl(ctx, "-addr", addr, "-json", "owner", "-hex", "757365722d3432", "6b32")
	var owners struct {
		Owners []ownerJSON `json:"owners"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &owners) != nil || len(owners.Owners) != 2 || owners.Owners[0].Owner != owner || owners.Owners[0].Epoch == 0 {
		t.Fatalf("owner -json -hex: %d %q", code, out)
	}

	code, out, _ = ctl(ctx, "-addr", addr, "-json", "map")
	var m struct {
		PartitionCount uint32          `json:"partition_count"`
		Partitions     []partitionJSON `json:"partitions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.PartitionCount != 32 || len(m.Partitions) != 32 {
		t.Fatalf("map -json: %d %q", code, out)
	}
	for i, p := range m.Partitions {
		want, _ := cl.Node("node-0").OwnerOfPartition(uint32(i))
		if p.Partition != uint32(i) || p.Owner != want.Node || p.Epoch != want.Token.Epoch {
			t.Fatalf("map row %d = %+v, the node says %+v", i, p, want)
		}
	}
	code, out, _ = ctl(ctx, "-addr", addr, "map")
	t.Logf("tenurectl map:\n%s", out)
	if code != 0 || !strings.Contains(out, "32 partitions on 3 owners") || strings.Count(out, "node-") != 3 {
		t.Fatalf("map: %d %q", code, out)
	}
	code, out, _ = ctl(ctx, "-addr", addr, "map", "-rows")
	if code != 0 || strings.Count(out, "\n") != 33 {
		t.Fatalf("map -rows: %d %q", code, out)
	}

	code, out, _ = ctl(ctx, "-addr", addr, "status")
	t.Logf("tenurectl status:\n%s", out)
	if code != 0 || !strings.Contains(out, "converged yes") || !strings.Contains(out, "(stable set of 3, v") ||
		!strings.Contains(out, "node-0 (this node)") || strings.Count(out, "127.0.0.1:") != 3 {
		t.Fatalf("status: %d %q", code, out)
	}
	code, out, _ = ctl(ctx, "-addr", addr, "-json", "status")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["node"] != "node-0" || st["partition_count"] != 32.0 || len(st["members"].([]any)) != 3 ||
		st["stable_version"] == 0.0 {
		t.Fatalf("status -json: %d %q", code, out)
	}

	// watch: a crash of node-2 shows as its partitions moving away.
	held := cl.Node("node-2").Status().Owned
	var wout, werr syncBuffer
	code = -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = run(ctx, []string{"-addr", addr, "-json", "watch", "-for", "30s", "-count", fmt.Sprint(held)}, &wout, &werr)
	}()
	if err := tenuretest.Poll(ctx, func() bool { return strings.Contains(werr.String(), "watching 32 partitions") }); err != nil {
		t.Fatalf("the watch never had its snapshot: %q", werr.String())
	}
	if err := cl.Crash("node-2"); err != nil {
		t.Fatal(err)
	}
	<-done
	lines := strings.Split(strings.TrimSpace(wout.String()), "\n")
	if code != 0 || len(lines) != held {
		t.Fatalf("watch: %d, %d lines for %d partitions: %q %q", code, len(lines), held, wout.String(), werr.String())
	}
	fromVictim := 0
	for _, l := range lines {
		var mv moveJSON
		if err := json.Unmarshal([]byte(l), &mv); err != nil {
			t.Fatalf("watch line %q: %v", l, err)
		}
		if mv.From == "node-2" {
			fromVictim++
		}
		if mv.To == "node-2" {
			t.Fatalf("a move to the crashed node: %q", l)
		}
	}
	if fromVictim == 0 {
		t.Fatalf("no move away from the crashed node: %q", wout.String())
	}
}

// syncBuffer is a bytes.Buffer safe to read while tenurectl writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The quorum on the status line: why there is none, when the node says.
func TestQuorumText(t *testing.T) {
	for _, c := range []struct {
		s    statusJSON
		want string
	}{
		{statusJSON{Quorum: true, Stable: []string{"a", "b", "c"}, StableVersion: 4}, "yes (stable set of 3, v4)"},
		{statusJSON{Stable: []string{"a", "b", "c"}, StableVersion: 4, NoQuorum: "reaches 1 of the 3 stable members, not a majority"},
			"NO (stable set of 3, v4): reaches 1 of the 3 stable members, not a majority"},
		{statusJSON{NoQuorum: "no stable membership yet"}, "NO: no stable membership yet"},
		{statusJSON{Stable: []string{"a"}, StableVersion: 1}, "NO (stable set of 1, v1)"},
		{statusJSON{}, "not reported"},
		{statusJSON{NoQuorum: "in doubt\x1b[2J"}, `NO: "in doubt\x1b[2J"`},
		{statusJSON{Quorum: true, Stable: []string{"a", "b", "c"}}, "yes (stable set of 3)"},
		{statusJSON{Quorum: true}, "yes"},
	} {
		if got := quorumText(c.s); got != c.want {
			t.Errorf("%+v: %q, want %q", c.s, got, c.want)
		}
	}
}

// noQuorumSource is a node that counts no quorum, and says why.
type noQuorumSource struct{ *coordinator.Coordinator }

func (s noQuorumSource) Status() coordinator.Status {
	st := s.Coordinator.Status()
	st.Quorum, st.NoQuorum, st.StableVersion = false, "reaches 1 of the 3 stable members, not a majority", 7
	st.Stable = []string{"node-0", "node-1", "node-2"}
	return st
}

// status shows why a node has no quorum, as a line and as JSON.
func TestStatusSaysWhyNoQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := cluster(t, ctx, tenuretest.Config{Nodes: 1})
	svc, err := routing.NewOwnershipService(routing.OwnershipServiceConfig{Source: noQuorumSource{cl.Node("node-0")}, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, svc.Register)
	code, out, _ := ctl(ctx, "-addr", addr, "status")
	if want := "quorum NO (stable set of 3, v7): reaches 1 of the 3 stable members, not a majority"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("status: %d %q, want a line with %q", code, out, want)
	}
	code, out, _ = ctl(ctx, "-addr", addr, "-json", "status")
	var st statusJSON
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Quorum || st.NoQuorum != "reaches 1 of the 3 stable members, not a majority" || st.StableVersion != 7 {
		t.Fatalf("status -json: %d %q", code, out)
	}
}
