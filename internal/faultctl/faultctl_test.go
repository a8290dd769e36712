package faultctl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }

const testPartitions = 16

// node is a kvstore node with fault control.
type node struct {
	*kvnode.Node
	ctl *Control
}

// startNodes starts n nodes with fault control on one SQLite file, each
// joining the first, and waits until they agree.
func startNodes(t *testing.T, n int) ([]node, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kv.db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nodes []node
	for i := range n {
		cc := coordinator.LocalConfig()
		cc.Ring = ring.Config{Partitions: testPartitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
		cfg := kvnode.Config{Name: fmt.Sprintf("n%d", i), GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", StatusAddr: "127.0.0.1:0", DataPath: path, Coordinator: cc}
		if i > 0 {
			cfg.Seeds = []string{nodes[0].GossipAddr()}
		}
		ctl, err := Install(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		kn, err := kvnode.Start(ctx, cfg)
		if err != nil {
			ctl.Close()
			t.Fatal(err)
		}
		ctl.Attach(kn)
		t.Cleanup(func() { kn.Close(); ctl.Close() })
		nodes = append(nodes, node{kn, ctl})
	}
	conv, cancelConv := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelConv()
	tenuretest.WaitFor(conv, t, "the nodes to converge", func() bool { return converged(nodes...) })
	return nodes, path
}

// converged reports whether every node sees exactly the others and a
// settled table.
func converged(nodes ...node) bool {
	for _, n := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		err := n.Coordinator().WaitConverged(ctx)
		cancel()
		if err != nil || len(n.Coordinator().Members()) != len(nodes) {
			return false
		}
	}
	return true
}

func client(t *testing.T, addr string) kvpb.KVClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return kvpb.NewKVClient(cc)
}

// post sends a fault-control request to n's status server and returns the
// HTTP status.
func post(t *testing.T, n node, path string) int {
	t.Helper()
	resp, err := http.Post("http://"+n.StatusAddr()+path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func cutPath(peers ...string) string {
	return "/debug/cut?peers=" + url.QueryEscape(strings.Join(peers, ","))
}

// A 2|1 cut through fault control splits the cluster; the majority keeps
// serving; after the heal the coordinators re-join and every partition has
// one owner again.
func TestCutAndHeal(t *testing.T) {
	nodes, path := startNodes(t, 3)
	majority, minority := nodes[:2], nodes[2]
	if code := post(t, minority, cutPath("not-an-address")); code != http.StatusBadRequest {
		t.Errorf("POST /debug/cut with a bad address: %d, want 400", code)
	}
	// Cut n2 off: on n2 through its status server, on the others directly.
	if code := post(t, minority, cutPath(majority[0].GossipAddr(), majority[1].GossipAddr())); code != http.StatusOK {
		t.Fatalf("POST /debug/cut: %d", code)
	}
	for _, n := range majority {
		if err := n.ctl.Cut([]string{minority.GossipAddr()}); err != nil {
			t.Fatal(err)
		}
	}
	settle, cancelSettle := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelSettle()
	tenuretest.WaitFor(settle, t, "the majority to settle without n2", func() bool { return converged(majority...) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv := client(t, majority[0].GRPCAddr())
	for i := range 10 {
		if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: fmt.Sprintf("split-%d", i), Value: []byte("v")}); err != nil {
			t.Fatalf("put during the split: %v", err)
		}
	}
	// Heal.
	if code := post(t, minority, cutPath()); code != http.StatusOK {
		t.Fatalf("POST /debug/cut (heal): %d", code)
	}
	for _, n := range majority {
		if err := n.ctl.Cut(nil); err != nil {
			t.Fatal(err)
		}
	}
	healed, cancelHealed := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelHealed()
	tenuretest.WaitFor(healed, t, "the healed cluster to converge", func() bool { return converged(nodes...) })
	if _, err := client(t, minority.GRPCAddr()).Put(ctx, &kvpb.PutRequest{Key: "healed", Value: []byte("v")}); err != nil {
		t.Fatalf("put after the heal: %v", err)
	}
	db, err := kvnode.OpenDB(path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if rows, violations, err := kvnode.VerifyLog(ctx, db, ""); err != nil || rows != 11 || violations != 0 {
		t.Errorf("VerifyLog = %d rows, %d violations, %v; want 11, 0", rows, violations, err)
	}
}

// A write held after the gate while a newer owner fences its partition
// meets the fence when released: refused, counted, logged nowhere.
func TestHeldWriteMeetsTheFence(t *testing.T) {
	nodes, path := startNodes(t, 1)
	n := nodes[0]
	kv := client(t, n.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: "run1/a", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	lease, err := n.Coordinator().Lease([]byte("run1/a"))
	if err != nil {
		t.Fatal(err)
	}
	p := lease.Partition()
	if code := post(t, n, fmt.Sprintf("/debug/hold?partition=%d", p)); code != http.StatusOK {
		t.Fatalf("POST /debug/hold: %d", code)
	}
	done := make(chan error, 1)
	go func() {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		defer pcancel()
		_, err := kv.Put(pctx, &kvpb.PutRequest{Key: "run1/a", Value: []byte("2")})
		done <- err
	}()
	held, cancelHeld := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelHeld()
	tenuretest.WaitFor(held, t, "the write to wait at the hold", func() bool { return n.ctl.Holding(p) })
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/hold?partition=%d", n.StatusAddr(), p))
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Waiting bool }
	err = json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&v)
	resp.Body.Close()
	if err != nil || !v.Waiting {
		t.Fatalf("GET /debug/hold = %+v, %v", v, err)
	}

	// Another owner, unknown to the cluster, fences the partition.
	db, err := kvnode.OpenDB(path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fence, err := sqlfence.New(db, sqlfence.SQLite(), sqlfence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer fence.Close()
	old := lease.Token()
	if _, err := fence.Fence(ctx, ownership.Token{Partition: p, Epoch: old.Epoch + 1, Owner: "intruder", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	if code := post(t, n, fmt.Sprintf("/debug/release?partition=%d", p)); code != http.StatusOK {
		t.Fatalf("POST /debug/release: %d", code)
	}
	// The router may retry the refused write and succeed once n0 has
	// claimed the partition again above the intruder: then under a new
	// epoch, and logged once.
	applied := 1
	if err := <-done; err == nil {
		applied++
	}
	if s := n.Stats(); s.StaleRejected != 1 {
		t.Errorf("stats %+v: want 1 stale write rejected", s)
	}
	if rows, violations, err := kvnode.VerifyLog(ctx, db, "run1/"); err != nil || rows != applied || violations != 0 {
		t.Errorf("VerifyLog = %d rows, %d violations, %v; want %d, 0", rows, violations, err, applied)
	}
	if code := post(t, n, "/debug/hold?partition=x"); code != http.StatusBadRequest {
		t.Errorf("POST /debug/hold?partition=x: %d, want 400", code)
	}
}

// Main names every endpoint in -fault-control's help, and serves them only
// with the flag.
func TestMainFlag(t *testing.T) {
	var help strings.Builder
	if err := Main(context.Background(), []string{"-h"}, io.Discard, &help); err == nil {
		t.Fatal("-h: no error")
	}
	for _, e := range []string{"POST /debug/cut", "POST /debug/hold", "GET  /debug/hold", "POST /debug/release"} {
		if !strings.Contains(help.String(), e) {
			t.Errorf("the help does not name %q:\n%s", e, help.String())
		}
	}
	for _, on := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		r, w := io.Pipe()
		args := []string{"-name", "m1", "-gossip", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-status", "127.0.0.1:0",
			"-data", filepath.Join(t.TempDir(), "kv.db"), "-preset", "local", "-partitions", "8"}
		if on {
			args = append(args, "-fault-control")
		}
		done := make(chan error, 1)
		go func() {
			err := Main(ctx, args, w, io.Discard)
			w.CloseWithError(io.EOF)
			done <- err
		}()
		var ready kvnode.Ready
		if err := json.NewDecoder(r).Decode(&ready); err != nil {
			cancel()
			t.Fatalf("ready line: %v (%v)", err, <-done)
		}
		go func() { _, _ = io.Copy(io.Discard, r) }()
		resp, err := http.Post("http://"+ready.Status+"/debug/hold?partition=1", "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.StatusCode == http.StatusOK; got != on {
			t.Errorf("fault control %v: POST /debug/hold answered %s", on, resp.Status)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Main = %v", err)
		}
	}
}
