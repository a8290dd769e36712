package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/ring"
)

// grpcurlCommand returns the path of grpcurl (.ci/run installs it with go
// install), failing the test (not skipping it) when it is missing.
func grpcurlCommand(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	p := filepath.Join(build.Default.GOPATH, "bin", "grpcurl")
	if _, err := exec.LookPath(p); err != nil {
		t.Fatalf("grpcurl is not installed (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3): %v", err)
	}
	return p
}

// grpcurl, which knows nothing of tenure, lists a node's services through
// server reflection and calls them: Ownership's Lookup answers the owner
// and the partition of "user:42" (195 of 271, as the protocol's partition
// function says), Status the node's health, and KV's Put, sent straight to
// the owner with the key in "tenure-key-bin", commits under that partition.
func TestGrpcurlReflection(t *testing.T) {
	grpcurl := grpcurlCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := kvnode.Start(ctx, kvnode.Config{Name: "n0", GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		DataPath: filepath.Join(t.TempDir(), "kv.db"), Coordinator: coordinator.LocalConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Coordinator().WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		args = append([]string{"-plaintext", "-max-time", "10"}, args...)
		out, err := exec.CommandContext(cctx, grpcurl, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	addr := n.GRPCAddr()

	services := strings.Fields(run(addr, "list"))
	for _, want := range []string{"tenure.examples.kv.v1.KV", "tenure.ownership.v1.Ownership", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		found := false
		for _, s := range services {
			found = found || s == want
		}
		if !found {
			t.Errorf("grpcurl list: %q, without %s", services, want)
		}
	}
	if methods := run(addr, "list", "tenure.ownership.v1.Ownership"); !strings.Contains(methods, "tenure.ownership.v1.Ownership.Watch") {
		t.Errorf("grpcurl list tenure.ownership.v1.Ownership: %q, without Watch", methods)
	}

	key := base64.StdEncoding.EncodeToString([]byte("user:42"))
	var lookup struct {
		Owner, Address, Token, Epoch string
		Partition                    int
	}
	out := run("-d", `{"key":"`+key+`"}`, addr, "tenure.ownership.v1.Ownership/Lookup")
	if err := json.Unmarshal([]byte(out), &lookup); err != nil {
		t.Fatalf("Lookup: %v\n%s", err, out)
	}
	if lookup.Owner != "n0" || lookup.Address != addr || lookup.Partition != 195 || lookup.Token == "" {
		t.Errorf("Lookup user:42 = %+v, want n0 at %s, partition 195, a token", lookup, addr)
	}

	var st struct {
		Node           string
		Started        bool
		PartitionCount int
		Owned          int
	}
	out = run(addr, "tenure.ownership.v1.Ownership/Status")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("Status: %v\n%s", err, out)
	}
	if st.Node != "n0" || !st.Started || st.PartitionCount != 271 || st.Owned != 271 {
		t.Errorf("Status = %+v, want n0, started, owning 271 of 271", st)
	}

	var put struct {
		Partition int
		Owner     string
	}
	out = run("-H", "tenure-key-bin: "+key, "-H", "tenure-request-id: grpcurl-1",
		"-d", `{"key":"user:42","value":"`+base64.StdEncoding.EncodeToString([]byte("hello"))+`"}`, addr, "tenure.examples.kv.v1.KV/Put")
	if err := json.Unmarshal([]byte(out), &put); err != nil {
		t.Fatalf("Put: %v\n%s", err, out)
	}
	if put.Partition != 195 || put.Owner != "n0" {
		t.Errorf("Put user:42 = %+v, want partition 195 at n0", put)
	}
	if st := n.Stats(); st.PutsApplied != 1 || st.Forwarded != 0 {
		t.Errorf("the node's counters %+v: want the Put applied as the owner, not forwarded", st)
	}
}

// grpcurl, which does not decode grpc-status-details-bin, still sees whom
// to ask: a Put sent to the node that does not own its key is answered
// FailedPrecondition with the owner's name and address in plain trailing
// metadata (tenure-owner, tenure-owner-addr), and the same Put sent
// there commits.
func TestGrpcurlSeesNotOwnerTrailers(t *testing.T) {
	grpcurl := grpcurlCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes := twoNodes(ctx, t)
	n0, n1 := nodes[0], nodes[1]
	var key string
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("user:%d", i)
		if o, err := n0.Coordinator().Owner([]byte(k)); err == nil && o.Node == "n1" {
			key = k
		}
	}
	put := func(addr string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		args := []string{"-plaintext", "-max-time", "10", "-v",
			"-H", "tenure-key-bin: " + base64.StdEncoding.EncodeToString([]byte(key)), "-H", "tenure-request-id: grpcurl-trailers",
			"-d", `{"key":"` + key + `","value":"` + base64.StdEncoding.EncodeToString([]byte("v")) + `"}`, addr, "tenure.examples.kv.v1.KV/Put"}
		out, err := exec.CommandContext(cctx, grpcurl, args...).CombinedOutput()
		return string(out), err
	}

	// A busy machine may make the cluster move the partition for a
	// moment: ask again (the request id makes it safe) until n0 refuses.
	var out string
	var err error
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	if tenuretest.Poll(pctx, func() bool {
		out, err = put(n0.GRPCAddr())
		return err != nil && strings.Contains(out, "FailedPrecondition")
	}) != nil {
		t.Fatalf("Put %s at n0, which does not own it: %v\n%s", key, err, out)
	}
	trailers := out[strings.Index(out, "Response trailers received:"):]
	for _, want := range []string{"tenure-owner: n1\n", "tenure-owner-addr: " + n1.GRPCAddr() + "\n"} {
		if !strings.Contains(trailers, want) {
			t.Errorf("grpcurl saw no %q in the trailers:\n%s", strings.TrimSpace(want), out)
		}
	}
	if tenuretest.Poll(pctx, func() bool {
		out, err = put(n1.GRPCAddr())
		return err == nil
	}) != nil || !strings.Contains(out, `"owner": "n1"`) {
		t.Errorf("Put %s at the owner the trailers named: %v\n%s", key, err, out)
	}
	if st := n0.Stats(); st.Forwarded != 0 || st.PutsApplied != 0 {
		t.Errorf("n0's counters %+v: the routed Put was forwarded or applied by a node that does not own it", st)
	}
}

// twoNodes starts a 2-node kvstore (16 partitions) and waits until each
// partition has one owner.
func twoNodes(ctx context.Context, t *testing.T) []*kvnode.Node {
	t.Helper()
	dir := t.TempDir()
	var nodes []*kvnode.Node
	for i := range 2 {
		cc := coordinator.LocalConfig()
		cc.Ring = ring.Config{Partitions: 16, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
		cfg := kvnode.Config{Name: fmt.Sprintf("n%d", i), GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
			DataPath: filepath.Join(dir, "kv.db"), Coordinator: cc}
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		n, err := kvnode.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	ncWaitOwned(ctx, t, nodes)
	return nodes
}
