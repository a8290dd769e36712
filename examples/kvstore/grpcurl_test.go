package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
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
