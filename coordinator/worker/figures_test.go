package worker_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/worker"
)

// TestFigures prints the consumer's figures (3 nodes, PostgreSQL, 32
// partitions, batches of 32):
//
//	consumer.events_per_second.fenced / .unfenced / .ratio (the same
//	    consumer, its commit through Offsets.Commit or a plain transaction
//	    of the same statements; best of two runs each, alternated)
//	consumer.duplicates / consumer.gaps  (through a pause past the lease
//	    mid-batch, a crash and a graceful leave)
//	consumer.user_lines  (non-blank, non-comment lines of the example's
//	    consumer package, tests excluded)
func TestFigures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pg := backends()[1]
	rate := func(unfenced bool) float64 {
		l := newEventLog(t, ctx, pg, 32, 32, 16)
		l.unfenced = unfenced
		cs := startConsumers(t, ctx, l, 3, worker.Config{MaxConcurrent: 8, PollInterval: 5 * time.Millisecond, MaxPollInterval: 20 * time.Millisecond})
		defer l.db.Close() // its connections, before the next run's
		defer cs.Close()   // the nodes stop polling before the next run
		const perPartition = 200
		if err := l.produce(ctx, perPartition); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		l.waitConsumed(ctx, t)
		d := time.Since(t0)
		if err := l.check(ctx, t).Err(); err != nil {
			t.Fatal(err)
		}
		return 32 * perPartition / d.Seconds()
	}
	// Alternated, best of two each: the machine's load varies.
	var fenced, unfenced float64
	for range 2 {
		fenced = max(fenced, rate(false))
		unfenced = max(unfenced, rate(true))
	}
	t.Logf("figure: consumer.events_per_second.fenced %.0f", fenced)
	t.Logf("figure: consumer.events_per_second.unfenced %.0f", unfenced)
	t.Logf("figure: consumer.events_per_second.ratio %.2f", fenced/unfenced)

	fc := runFaults(t, ctx, pg, 32, 32)
	t.Logf("figure: consumer.duplicates %d", fc.report.Duplicates)
	t.Logf("figure: consumer.gaps %d", fc.report.Gaps)
	t.Logf("figure: consumer.paused_batches_refused %d", fc.pausedStale)
	t.Logf("figure: consumer.leaver_commits_refused %d", fc.leaverStale)
	if err := fc.report.Err(); err != nil {
		t.Error(err)
	}

	lines := 0
	files, _ := filepath.Glob("../../examples/consumer/consumer/*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		lines += codeLines(t, f)
	}
	if lines == 0 {
		t.Fatal("no lines in the example's consumer")
	}
	t.Logf("figure: consumer.user_lines %d", lines)
}

// codeLines counts the non-blank lines of a Go file outside comments.
func codeLines(t *testing.T, path string) int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, inBlock := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		switch {
		case inBlock:
			inBlock = !strings.Contains(s, "*/")
		case strings.HasPrefix(s, "/*"):
			inBlock = !strings.Contains(s, "*/")
		case s == "" || strings.HasPrefix(s, "//"):
		default:
			n++
		}
	}
	return n
}
