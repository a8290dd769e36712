//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/internal/netns"
	"github.com/tenure-go/tenure/internal/testdb"
)

// TestMain runs the test binary as a kvstore node when the demo starts it
// as one (the demo starts its own executable), and checks for leaked
// goroutines otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNode(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// TestDemoShort runs the demo's short mode: five child processes, a
// SIGSTOP past the lease, a SIGKILL and restart, a network cut and heal,
// and a graceful leave, under a concurrent workload. Each node runs in a
// network namespace of its own and keeps its data in PostgreSQL through a
// relay on the network (-netns), so the cut drops the minority's gossip,
// gRPC and database traffic in the kernel. It needs root, and fails
// without it. It fails if an acknowledged write was lost or a stale write
// was accepted.
//
// The L2 rows (calls failed during the graceful leave) are shown but not
// judged here: the test runs beside the other packages' tests, and at that
// load a one-second client budget fails calls everywhere, the leave's
// window included (in one CI run: one call sent 0.6 s before the leave
// began, out of time 0.4 s into it). L2 under load is issue 20's open
// item; TestClientFiguresListTheLeaveFailures holds the judging itself,
// and a bare `go run ./examples/demo` judges the rows, as CI's demo step
// does on SQLite, whose writers now take turns (kvnode's write queue).
// That queue is SQLite's: this test's data is in PostgreSQL, and the
// failures it saw were the load's, so its rows stay unjudged.
func TestDemoShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := config{
		nodes: 5, partitions: 32, writers: 8, keys: 32,
		phase: 300 * time.Millisecond, pause: 4 * time.Second, cut: 4 * time.Second, timeout: 6 * time.Second,
		dir: t.TempDir(), report: filepath.Join(t.ArtifactDir(), "demo-report.html"),
		netns: true, dsn: testdb.PostgresSchemaDSN(t),
	}
	ok, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("the demo failed a check (see its report above): a lost acknowledged write, an accepted stale write, " +
			"a stale read, a history that is not linearizable, a paused write the fence did not refuse, " +
			"a write log shorter than the acknowledged writes, a write committed twice, or a call failed or an outcome left unknown " +
			"during the graceful leave (L2)")
	}
	// With -netns the run also injects loss and a one-way cut after the heal.
	checkRunReport(t, cfg.report, slices.Insert(slices.Clone(demoEvents), slices.Index(demoEvents, "network healed")+1, lossyPhase))
	// The run removed its network namespaces (netns.Prefix, then this
	// process's pid).
	left, err := filepath.Glob(fmt.Sprintf("/run/netns/%s%d-*", netns.Prefix, os.Getpid()))
	if err != nil || len(left) > 0 {
		t.Errorf("network namespaces left after the run: %v %v", left, err)
	}
}

// The history check accepts what a register allows, unknown outcomes
// either way, and catches a read of a value older than an acknowledged
// write.
func TestCheckHistory(t *testing.T) {
	put := func(v uint64, start, end int64) op { return op{key: 7, put: true, value: v, start: start, end: end} }
	get := func(v uint64, start, end int64) op { return op{key: 7, value: v, start: start, end: end} }
	for _, c := range []struct {
		name    string
		history []op
		want    bool
	}{
		{"sequential", []op{put(1, 0, 10), get(1, 20, 30), put(2, 40, 50), get(2, 60, 70)}, true},
		{"unknown put applied late", []op{put(1, 0, 10), put(2, 20, unknownEnd), get(1, 30, 40), get(2, 50, 60)}, true},
		{"unknown put never applied", []op{put(1, 0, 10), put(2, 20, unknownEnd), get(1, 30, 40)}, true},
		{"read older than an acknowledged write", []op{put(1, 0, 10), put(2, 20, 30), get(1, 40, 50)}, false},
		{"read goes back", []op{put(1, 0, 10), put(2, 20, unknownEnd), get(2, 30, 40), get(1, 50, 60)}, false},
	} {
		path := filepath.Join(t.TempDir(), "v.html")
		res, err := checkHistory(c.history, path)
		if ok := res == porcupine.Ok; err != nil || ok != c.want {
			t.Errorf("%s: check = %v, %v; want linearizable %v", c.name, res, err, c.want)
		}
		if _, err := os.Stat(path); !c.want && err != nil {
			t.Errorf("%s: no visualization written: %v", c.name, err)
		}
	}
}

// A value older than the last acknowledged one is a late write only if
// the writer sent it in a call that failed; an acknowledged older value,
// or one never sent, is not.
func TestUnknownIsAFailedCallOnly(t *testing.T) {
	d := &demo{cfg: config{keys: 4}}
	w := &writer{id: 1}
	key := w.id*d.cfg.keys + 2
	w.history = []op{
		{key: key, put: true, value: 1, start: 0, end: 10},
		{key: key, put: true, value: 2, start: 20, end: unknownEnd},
		{key: key, put: true, value: 3, start: 30, end: 40},
		{key: key + 1, put: true, value: 4, start: 50, end: unknownEnd},
		{key: key, value: 5, start: 60, end: 70},
	}
	for _, c := range []struct {
		v    uint64
		want bool
	}{{1, false}, {2, true}, {3, false}, {4, false}, {5, false}, {6, false}} {
		if got := d.unknown(w, 2, c.v); got != c.want {
			t.Errorf("unknown(key 2, value %d) = %v, want %v", c.v, got, c.want)
		}
	}
}

// logOf lists a key's write log in commit order, with the request ids.
func TestLogOfListsAKeysWrites(t *testing.T) {
	d := &demo{dir: t.TempDir()}
	db, err := kvnode.OpenDB(d.sqlitePath(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE kv_log (id INTEGER PRIMARY KEY, owner TEXT, epoch BIGINT, key TEXT, value BLOB, request_id TEXT)`,
		`INSERT INTO kv_log (owner, epoch, key, value, request_id) VALUES ('node-3', 4, 'k', '3', 'r/3'), ('node-4', 2, 'other', '9', NULL), ('node-3', 4, 'k', '2', 'r/2')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	want := "  log 1: value 3 by node-3 at epoch 4, request r/3\n  log 3: value 2 by node-3 at epoch 4, request r/2\n"
	if got := d.logOf(t.Context(), "k"); got != want {
		t.Errorf("logOf = %q, want %q", got, want)
	}
}
