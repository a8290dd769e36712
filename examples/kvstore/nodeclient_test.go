package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/ring"
)

// nodeClientDir holds the Node.js client; .ci/run installs its modules
// (npm ci) before the tests.
const nodeClientDir = "nodeclient"

// nodeCommand returns the path of node, failing the test (not skipping
// it) when node or the client's modules are missing.
func nodeCommand(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node (Node.js) is not installed: %v", err)
	}
	for _, m := range []string{"@grpc/grpc-js", "@grpc/proto-loader"} {
		if _, err := os.Stat(filepath.Join(nodeClientDir, "node_modules", m, "package.json")); err != nil {
			t.Fatalf("the Node.js client's module %s is missing (run npm ci in examples/kvstore/%s): %v", m, nodeClientDir, err)
		}
	}
	return node
}

// The Node.js client computes partitions with its own XXH64, which agrees
// with every vector of the protocol's file.
func TestNodeClientPartitionVectors(t *testing.T) {
	node := nodeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "vectors_test.js")
	cmd.Dir = nodeClientDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node vectors_test.js: %v\n%s", err, out)
	}
	var r struct {
		Checked, Failed int
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil || r.Checked < 30 || r.Failed != 0 {
		t.Fatalf("node vectors_test.js: %s (%v)", out, err)
	}
}

// nodeReport is the client's last line (see nodeclient/client.js).
type nodeReport struct {
	Event             string         `json:"event"`
	OK                bool           `json:"ok"`
	Error             string         `json:"error"`
	Acked             int            `json:"acked"`
	Failed            int            `json:"failed"`
	Lost              int            `json:"lost"`
	Unverified        int            `json:"unverified"`
	Retries           int            `json:"retries"`
	NotOwner          int            `json:"not_owner"`
	Unavailable       int            `json:"unavailable"`
	UnknownOutcome    int            `json:"unknown_outcome"`
	PartitionMismatch int            `json:"partition_mismatch"`
	OwnerMismatch     int            `json:"owner_mismatch"`
	HintsFollowed     int            `json:"hints_followed"`
	Moves             int            `json:"moves"`
	WatchReconnects   int            `json:"watch_reconnects"`
	AcksByOwner       map[string]int `json:"acks_by_owner"`
	LastError         string         `json:"last_error"`
}

// A client in another language, written against the protocol only (the
// .proto files, the partition function, the metadata keys), follows a
// crash and a graceful leave of a 3-node kvstore while it writes, without
// losing an acknowledged write: it watches ownership through the
// Ownership service (first on the node that crashes, then on the one that
// leaves, then on the last), sends every Put straight to its key's owner,
// and reads every acknowledged key back at the end. Crash first, then
// leave: the last node keeps a quorum (a leave then a crash would leave
// one of two members).
func TestNodeClientFollowsCrashAndLeave(t *testing.T) {
	node := nodeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	dir := t.TempDir()
	var nodes []*kvnode.Node
	for i := range 3 {
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

	// Watch the node that crashes first, then the one that leaves.
	seeds := []string{nodes[2].GRPCAddr(), nodes[1].GRPCAddr(), nodes[0].GRPCAddr()}
	const prefix = "nodeclient"
	c := startNodeClient(ctx, t, node, seeds, prefix)

	c.writing("before the faults", 100)
	nodes[2].Close() // a crash: no handoff
	ncWaitOwned(ctx, t, nodes[:2])
	c.writing("after the crash", 100)
	lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
	err := nodes[1].Leave(lctx)
	lcancel()
	if err != nil {
		t.Fatalf("n1 leave: %v", err)
	}
	ncWaitOwned(ctx, t, nodes[:1])
	c.writing("after the leave", 100)

	report, err := c.stop()
	if err != nil {
		c.failf("the client exited with %v; report %+v", err, report)
	}
	watching := c.watching.Load()
	t.Logf("client: %d writes acknowledged and read back, %d retries (%d not owner, %d unavailable, %d unknown outcome), %d moves seen, %d watch reconnects, acks by owner %v",
		report.Acked, report.Retries, report.NotOwner, report.Unavailable, report.UnknownOutcome, report.Moves, report.WatchReconnects, report.AcksByOwner)
	switch {
	case !report.OK || report.Lost != 0 || report.Unverified != 0 || report.Failed != 0:
		t.Errorf("report %+v: an acknowledged write was lost, unreadable, or a write failed", report)
	case report.PartitionMismatch != 0 || report.OwnerMismatch != 0:
		t.Errorf("report %+v: the owner applied a write under another partition or name than the client computed", report)
	case report.Acked < 300:
		t.Errorf("report %+v: %d writes acknowledged, want at least 300", report, report.Acked)
	case report.Moves == 0 || report.WatchReconnects < 2 || watching < 3:
		t.Errorf("report %+v: the client saw %d moves, reconnected its watch %d times and completed %d snapshots; want moves, 2 reconnects and 3 snapshots",
			report, report.Moves, report.WatchReconnects, watching)
	}
	for _, n := range []string{"n0", "n1", "n2"} {
		if report.AcksByOwner[n] == 0 {
			t.Errorf("no write was acknowledged by %s: %v", n, report.AcksByOwner)
		}
	}
	// Straight to the owner: no node forwarded any of the client's calls.
	for _, n := range nodes {
		if f := n.Stats().Forwarded; f != 0 {
			t.Errorf("%s forwarded %d calls", n.Coordinator().Self().Name, f)
		}
	}
	db, err := kvnode.OpenDB(filepath.Join(dir, "kv.db"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, violations, err := kvnode.VerifyLog(ctx, db, prefix)
	if err != nil || violations != 0 || rows < report.Acked {
		t.Errorf("kv_log: %d rows, %d written under a stale token (%v); the client acknowledged %d", rows, violations, err, report.Acked)
	}
	if _, dups, err := kvnode.CountDuplicates(ctx, db, prefix); err != nil || dups != 0 {
		t.Errorf("kv_log: %d writes applied twice (%v)", dups, err)
	}
}

// The Node.js client's checks of how it reads a NOT_OWNER answer's
// trailers (nodeclient/hint_test.js), against a grpc-js server.
func TestNodeClientHintDecoding(t *testing.T) {
	node := nodeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "hint_test.js")
	cmd.Dir = nodeClientDir
	out, err := cmd.CombinedOutput()
	var r struct{ Checked, Failed int }
	if err != nil || json.Unmarshal(bytes.TrimSpace(out), &r) != nil || r.Checked == 0 || r.Failed != 0 {
		t.Fatalf("node hint_test.js: %v\n%s", err, out)
	}
}

// A client in another language follows NOT_OWNER answers by their plain
// trailers alone (it does not decode grpc-status-details-bin): told to
// send the first attempt of every write to n0 (-first-to), as with a stale
// view, it gets NOT_OWNER for n1's keys and resends each at once to the
// address the trailers name: every refusal is followed by its hint, and
// no call is forwarded.
func TestNodeClientFollowsNotOwnerTrailers(t *testing.T) {
	node := nodeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nodes := twoNodes(ctx, t)
	c := startNodeClient(ctx, t, node, []string{nodes[0].GRPCAddr()}, "nchint", "-first-to", nodes[0].GRPCAddr())
	c.writing("misrouted", 60)
	report, err := c.stop()
	if err != nil {
		c.failf("the client exited with %v; report %+v", err, report)
	}
	t.Logf("client: %d acknowledged, %d not owner, %d hints followed, %d retries, acks by owner %v",
		report.Acked, report.NotOwner, report.HintsFollowed, report.Retries, report.AcksByOwner)
	if !report.OK || report.AcksByOwner["n1"] == 0 || report.AcksByOwner["n0"] == 0 {
		t.Errorf("report %+v: want every write acknowledged and read back, by both nodes", report)
	}
	if report.HintsFollowed == 0 || report.HintsFollowed != report.NotOwner {
		t.Errorf("%d NOT_OWNER answers, %d hints followed: want every refusal followed by its trailers", report.NotOwner, report.HintsFollowed)
	}
	for _, n := range nodes {
		if f := n.Stats().Forwarded; f != 0 {
			t.Errorf("%s forwarded %d calls", n.Coordinator().Self().Name, f)
		}
	}
}

// nodeClient is a run of nodeclient/client.js.
type nodeClient struct {
	t        *testing.T
	ctx      context.Context
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	stderr   ncBuffer
	acked    atomic.Int64 // from its progress lines
	watching atomic.Int64 // snapshots completed
	mu       sync.Mutex
	tail     []string // the last lines, for failure messages
	report   nodeReport
	reported chan struct{}
	scanned  chan struct{}
}

// startNodeClient starts the client writing keys under prefix, watching
// seeds in turn; ctx bounds its whole run.
func startNodeClient(ctx context.Context, t *testing.T, node string, seeds []string, prefix string, flags ...string) *nodeClient {
	t.Helper()
	c := &nodeClient{t: t, ctx: ctx, reported: make(chan struct{}), scanned: make(chan struct{})}
	args := append([]string{"client.js", "-seeds", strings.Join(seeds, ","), "-prefix", prefix, "-max-ms", "60000"}, flags...)
	c.cmd = exec.CommandContext(ctx, node, args...)
	c.cmd.Dir = nodeClientDir
	c.cmd.WaitDelay = 5 * time.Second
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill() // after stop, a no-op
		<-c.scanned
		_ = c.cmd.Wait()
	})
	go func() {
		defer close(c.scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			var ev struct {
				Event string `json:"event"`
				Acked int64  `json:"acked"`
			}
			_ = json.Unmarshal([]byte(line), &ev)
			c.mu.Lock()
			if c.tail = append(c.tail, line); len(c.tail) > 10 {
				c.tail = c.tail[1:]
			}
			c.mu.Unlock()
			switch ev.Event {
			case "progress":
				c.acked.Store(ev.Acked)
			case "watching":
				c.watching.Add(1)
			case "report":
				if err := json.Unmarshal([]byte(line), &c.report); err == nil {
					close(c.reported)
				}
			}
		}
	}()
	return c
}

func (c *nodeClient) failf(format string, args ...any) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t.Fatalf("%s\nclient's last lines:\n%s\nstderr:\n%s", fmt.Sprintf(format, args...), strings.Join(c.tail, "\n"), c.stderr.String())
}

// writing waits until the client has acknowledged n more writes.
func (c *nodeClient) writing(what string, n int64) {
	c.t.Helper()
	want := c.acked.Load() + n
	if !ncPoll(c.ctx, 30*time.Second, func() bool { return c.acked.Load() >= want }) {
		c.failf("%s: the client acknowledged %d writes, want %d", what, c.acked.Load(), want)
	}
}

// stop tells the client to stop writing, and returns its report and its
// exit status once it has read every acknowledged key back and exited.
func (c *nodeClient) stop() (nodeReport, error) {
	c.t.Helper()
	if _, err := fmt.Fprintln(c.stdin, "stop"); err != nil {
		c.failf("stop the client: %v", err)
	}
	c.stdin.Close()
	select {
	case <-c.reported:
	case <-c.ctx.Done():
		c.failf("no report from the client")
	}
	<-c.scanned
	return c.report, c.cmd.Wait()
}

// The client's check is not vacuous: when acknowledged keys vanish from
// the database before it reads them back (deleted behind its back), it
// reports them lost and exits 1.
func TestNodeClientDetectsLoss(t *testing.T) {
	node := nodeCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "kv.db")
	cc := coordinator.LocalConfig()
	cc.Ring = ring.Config{Partitions: 16, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	n, err := kvnode.Start(ctx, kvnode.Config{Name: "n0", GossipAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", DataPath: path, Coordinator: cc})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ncWaitOwned(ctx, t, []*kvnode.Node{n})

	c := startNodeClient(ctx, t, node, []string{n.GRPCAddr()}, "ncloss")
	c.writing("before the deletion", 50)
	db, err := kvnode.OpenDB(path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.ExecContext(ctx, `DELETE FROM kv WHERE key LIKE 'ncloss-%'`)
	if err != nil {
		t.Fatal(err)
	}
	deleted, _ := res.RowsAffected()
	report, err := c.stop()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || report.OK || report.Lost < int(deleted) || deleted == 0 {
		t.Fatalf("%d acknowledged keys deleted: the client exited with %v, report %+v; want exit status 1 and them lost", deleted, err, report)
	}
}

// ncBuffer is a bytes.Buffer safe to read while a command writes to it.
type ncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *ncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *ncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// ncWaitOwned waits until every node of nodes sees exactly them as members
// and every partition has one owner among them with a live lease.
func ncWaitOwned(ctx context.Context, t *testing.T, nodes []*kvnode.Node) {
	t.Helper()
	ok := ncPoll(ctx, 30*time.Second, func() bool {
		for _, n := range nodes {
			if len(n.Coordinator().Members()) != len(nodes) {
				return false
			}
		}
		for p := range uint32(16) {
			owners := 0
			for _, n := range nodes {
				if _, err := n.Coordinator().LeaseOfPartition(p); err == nil {
					owners++
				}
			}
			if owners != 1 {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("the %d nodes did not own every partition between them", len(nodes))
	}
}

// ncPoll polls cond (tenuretest.Poll) until it holds (true), or timeout
// passes or ctx ends (false).
func ncPoll(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return tenuretest.Poll(ctx, cond) == nil
}
