package kvnode_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
)

func TestClusterSQLite(t *testing.T) { testCluster(t, sqliteDatabase(t)) }

func TestClusterPostgres(t *testing.T) { testCluster(t, postgresDatabase(t)) }

// testCluster writes keys through nodes that don't own them and reads them
// back through a third node.
func testCluster(t *testing.T, db database) {
	nodes := startCluster(t, testConfig("n0", db), testConfig("n1", db), testConfig("n2", db))
	clients := []kvpb.KVClient{client(t, nodes[0].GRPCAddr()), client(t, nodes[1].GRPCAddr()), client(t, nodes[2].GRPCAddr())}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const keys = 30
	for i := range keys {
		key := fmt.Sprintf("key-%d", i)
		owner := ownerOf(t, nodes, key)
		via, reader := (owner+1)%3, (owner+2)%3
		value := []byte(fmt.Sprintf("value-%d", i))
		put, err := clients[via].Put(ctx, &kvpb.PutRequest{Key: key, Value: value})
		if err != nil {
			t.Fatalf("put %s via %s: %v", key, names(nodes[via:via+1]), err)
		}
		if want := nodes[owner].Coordinator().Self().Name; put.GetOwner() != want || put.GetEpoch() == 0 {
			t.Errorf("put %s: applied by %s in epoch %d, want %s", key, put.GetOwner(), put.GetEpoch(), want)
		}
		got, err := clients[reader].Get(ctx, &kvpb.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if !got.GetFound() || string(got.GetValue()) != string(value) || got.GetPartition() != put.GetPartition() {
			t.Errorf("get %s = %q found %v in p%d, want %q in p%d", key, got.GetValue(), got.GetFound(), got.GetPartition(), value, put.GetPartition())
		}
	}
	missing, err := clients[0].Get(ctx, &kvpb.GetRequest{Key: "never-written"})
	if err != nil || missing.GetFound() {
		t.Errorf("get of a missing key = %v, %v; want not found", missing, err)
	}
	wantForwarded := uint64(2 * keys) // every put and get above went through a non-owner
	if ownerOf(t, nodes, "never-written") != 0 {
		wantForwarded++
	}
	if _, err := clients[0].Put(ctx, &kvpb.PutRequest{Key: ""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("put with an empty key: %v, want InvalidArgument", err)
	}

	var applied, forwarded, gets uint64
	for _, n := range nodes {
		s := n.Stats()
		applied, forwarded, gets = applied+s.PutsApplied, forwarded+s.Forwarded, gets+s.Gets
		if s.StaleRejected != 0 {
			t.Errorf("%s rejected %d stale writes in a stable cluster", n.Coordinator().Self().Name, s.StaleRejected)
		}
	}
	if applied != keys || gets != keys+1 || forwarded != wantForwarded {
		t.Errorf("puts applied %d, gets %d, forwarded %d; want %d, %d, %d", applied, gets, forwarded, keys, keys+1, wantForwarded)
	}
	rows, violations, err := kvnode.VerifyLog(ctx, db.open(t), "")
	if err != nil || rows != keys || violations != 0 {
		t.Errorf("VerifyLog = %d rows, %d violations, %v; want %d, 0", rows, violations, err, keys)
	}
}

// A write under a token older than the partition's mark is refused by the
// fence and counted, and the log shows no stale write; a stale record
// slipped into the log is caught.
func TestStaleWriteRejected(t *testing.T) {
	db := sqliteDatabase(t)
	nodes := startCluster(t, testConfig("n0", db))
	kv := client(t, nodes[0].GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := kv.Put(ctx, &kvpb.PutRequest{Key: fmt.Sprintf("k%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}

	// Another owner, unknown to the cluster, fences the partition of k0,
	// as a new owner would while n0 is paused.
	lease, err := nodes[0].Coordinator().Lease([]byte("k0"))
	if err != nil {
		t.Fatal(err)
	}
	old := lease.Token()
	sqldb := fenceAbove(ctx, t, db, old)

	// n0 still holds its lease and writes under the old token: refused.
	// The lease ends, and no node claims the partition until membership
	// changes (L5), so the call runs out of time.
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	_, err = kv.Put(pctx, &kvpb.PutRequest{Key: "k0", Value: []byte("stale")})
	pcancel()
	if err == nil {
		t.Fatal("a write under a fenced-out token succeeded")
	}
	if s := nodes[0].Stats(); s.StaleRejected == 0 {
		t.Errorf("stats %+v: the stale write was not counted", s)
	}
	if lease.Err() == nil {
		t.Error("the fenced-out lease is still live")
	}
	rows, violations, err := kvnode.VerifyLog(ctx, sqldb, "")
	if err != nil || rows != 5 || violations != 0 {
		t.Errorf("VerifyLog = %d rows, %d violations, %v; want 5 rows, 0 violations", rows, violations, err)
	}

	// Negative control: the write a broken fence would let through, under
	// the old token after the newer fence, with no newer write after it
	// (no later token in the log gives it away, only the mark does).
	if _, err := sqldb.ExecContext(ctx, `INSERT INTO kv_log (partition, epoch, owner, incarnation, key, value, mark_epoch, mark_owner, mark_incarnation)
		SELECT partition_id, $2, $3, $4, 'k0', x'00', epoch, owner, incarnation FROM tenure_partitions WHERE partition_id = $1`,
		int64(old.Partition), int64(old.Epoch), old.Owner, fmt.Sprintf("%016x", old.Incarnation)); err != nil {
		t.Fatal(err)
	}
	if rows, violations, err = kvnode.VerifyLog(ctx, sqldb, ""); err != nil || rows != 6 || violations != 1 {
		t.Errorf("VerifyLog with a write past the fence = %d rows, %d violations, %v; want 6, 1", rows, violations, err)
	}
	// And a record under a token lower than one applied before it.
	if _, err := sqldb.ExecContext(ctx, `INSERT INTO kv_log (partition, epoch, owner, incarnation, key, value, mark_epoch, mark_owner, mark_incarnation)
		VALUES ($1, 0, 'ghost', '0000000000000001', 'k0', x'00', 0, 'ghost', '0000000000000001')`, int64(old.Partition)); err != nil {
		t.Fatal(err)
	}
	if rows, violations, err = kvnode.VerifyLog(ctx, sqldb, ""); err != nil || rows != 7 || violations != 2 {
		t.Errorf("VerifyLog with a lower token = %d rows, %d violations, %v; want 7, 2", rows, violations, err)
	}
}

// Main runs a node from flags, announces it on stdout, serves, and leaves
// when its context ends.
func TestMainServesAndLeaves(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, w := io.Pipe()
	done := make(chan error, 1)
	args := []string{
		"-name", "m1", "-gossip", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-status", "127.0.0.1:0",
		"-data", filepath.Join(t.TempDir(), "kv.db"), "-preset", "local", "-partitions", "8",
		"-gossip-key", "MDEyMzQ1Njc4OWFiY2RlZg==",
	}
	go func() {
		err := kvnode.Main(ctx, args, w, io.Discard)
		w.CloseWithError(io.EOF)
		done <- err
	}()

	lines := bufio.NewScanner(r)
	if !lines.Scan() {
		t.Fatalf("no ready line: %v", lines.Err())
	}
	var ready kvnode.Ready
	if err := json.Unmarshal(lines.Bytes(), &ready); err != nil {
		t.Fatalf("ready line %q: %v", lines.Text(), err)
	}
	if ready.Event != "ready" || ready.Name != "m1" || ready.Gossip == "" || ready.GRPC == "" || ready.Status == "" ||
		strings.HasSuffix(ready.GRPC, ":0") {
		t.Fatalf("ready line %q", lines.Text())
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for lines.Scan() {
			b.WriteString(lines.Text())
		}
		rest <- b.String()
	}()

	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	kv := client(t, ready.GRPC)
	if _, err := kv.Put(cctx, &kvpb.PutRequest{Key: "hello", Value: []byte("world")}); err != nil {
		t.Fatal(err)
	}
	got, err := kv.Get(cctx, &kvpb.GetRequest{Key: "hello"})
	if err != nil || string(got.GetValue()) != "world" || got.GetOwner() != "m1" {
		t.Fatalf("get = %v, %v", got, err)
	}
	var stats kvnode.Stats
	resp, err := http.Get("http://" + ready.Status + "/kv/stats")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&stats)
	resp.Body.Close()
	if err != nil || stats.PutsApplied != 1 || stats.Gets != 1 {
		t.Errorf("/kv/stats = %+v, %v", stats, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Main = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Main did not return after its context ended")
	}
	if extra := <-rest; extra != "" {
		t.Errorf("Main wrote more than the ready line to stdout: %q", extra)
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{},                                 // no -name
		{"-name", "x", "-preset", "wan"},   // unknown preset
		{"-name", "x", "-gossip-key", "!"}, // not base64
		{"-name", "x", "-grpc", "0.0.0.0:0", "-data", filepath.Join(dir, "kv.db")}, // not dialable
		{"-name", "x", "extra"},
		{"-no-such-flag"},
	} {
		if err := kvnode.Main(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("Main(%q) = nil, want an error", args)
		}
	}
}

// OpenDB bounds how long a paused node's open transaction can hold its
// fence row on PostgreSQL, unless the DSN chooses.
func TestOpenDBIdleInTransactionTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := postgresDatabase(t).dsn
	for _, c := range []struct{ dsn, want string }{
		{dsn, "2s"},
		{dsn + "&idle_in_transaction_session_timeout=7000", "7s"},
	} {
		db, err := kvnode.OpenDB("", c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = db.QueryRowContext(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&got)
		db.Close()
		if err != nil || got != c.want {
			t.Errorf("idle_in_transaction_session_timeout = %q, %v; want %q", got, err, c.want)
		}
	}
}

// A database whose kv_log predates the mark columns is refused at start
// with a message that says what to do.
func TestOldSchemaRefused(t *testing.T) {
	db := sqliteDatabase(t)
	sqldb := db.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := sqldb.ExecContext(ctx, `CREATE TABLE kv_log (id INTEGER PRIMARY KEY, partition BIGINT, epoch BIGINT,
		owner TEXT, incarnation TEXT, key TEXT, value BLOB)`); err != nil {
		t.Fatal(err)
	}
	n, err := kvnode.Start(ctx, testConfig("n0", db))
	if err == nil {
		n.Close()
		t.Fatal("Start accepted a kv_log without the mark columns")
	}
	if !strings.Contains(err.Error(), "predates the mark and request id columns") {
		t.Errorf("Start: %v; want it to say the table predates the mark and request id columns", err)
	}
}
