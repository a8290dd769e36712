//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/goleak"
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
// and a graceful leave, under a concurrent workload. It fails if an
// acknowledged write was lost or a stale write was accepted.
func TestDemoShort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := config{
		nodes: 5, partitions: 32, writers: 8, keys: 32,
		phase: 300 * time.Millisecond, pause: 4 * time.Second, cut: 4 * time.Second, timeout: 6 * time.Second,
		dir: t.TempDir(), report: filepath.Join(t.ArtifactDir(), "demo-report.html"), strictLeave: true,
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
	checkRunReport(t, cfg.report)
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
