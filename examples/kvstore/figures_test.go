//go:build unix

package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/internal/faultctl"
	"github.com/tenure-go/tenure/internal/sigstop"
	"github.com/tenure-go/tenure/transport"
)

// nodeArg, as the first argument, makes the test binary a kvstore node.
const nodeArg = "kvnode"

// TestMain runs the test binary as a kvstore node when TestFigures starts
// it as one, and checks for leaked goroutines otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nodeArg {
		os.Exit(main1(os.Args[2:]))
	}
	tenuretest.VerifyTestMain(m)
}

// main1 is the command's main for a node started by the test.
func main1(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := faultctl.Main(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// proc is one node process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	ready  kvnode.Ready
	conn   *grpc.ClientConn
	kv     kvpb.KVClient
}

// spawnCluster starts n nodes named n0, n1, ..., each joining n0, with the
// flags more.
func spawnCluster(t *testing.T, dir string, n int, more ...string) []*proc {
	var ps []*proc
	for i := range n {
		var seeds []string
		if i > 0 {
			seeds = []string{ps[0].ready.Gossip}
		}
		ps = append(ps, spawn(t, dir, fmt.Sprintf("n%d", i), seeds, more...))
	}
	return ps
}

// spawn starts a node process logging to dir, joining seeds, with the
// flags in more (its database: -data or -dsn).
func spawn(t *testing.T, dir, name string, seeds []string, more ...string) *proc {
	t.Helper()
	args := append([]string{nodeArg, "-name", name, "-gossip", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-status", "127.0.0.1:0",
		"-preset", "local", "-partitions", "16"}, more...)
	if len(seeds) > 0 {
		args = append(args, "-seeds", seeds[0])
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: exec.Command(os.Args[0], args...), exited: make(chan struct{})}
	p.cmd.Stderr = logf
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
		_ = p.cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	select {
	case line := <-lines:
		if err := json.Unmarshal([]byte(line), &p.ready); err != nil {
			t.Fatalf("%s: ready line %q: %v", name, line, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start (log in %s)", name, dir)
	}
	if p.conn, err = grpc.NewClient(p.ready.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	p.kv = kvpb.NewKVClient(p.conn)
	return p
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.exited
	if p.conn != nil {
		p.conn.Close()
	}
}

// members returns the names of the members p sees and whether its view
// has converged, or nil if it does not answer.
func (p *proc) members() ([]string, bool) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + p.ready.Status + "/?format=json")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var v struct {
		Converged bool `json:"converged"`
		Members   []struct{ Name string }
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return nil, false
	}
	var names []string
	for _, m := range v.Members {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return names, v.Converged
}

// settle waits, within a minute, until each of among sees exactly among
// as the members and its view has converged.
func settle(ctx context.Context, t *testing.T, what string, among ...*proc) {
	t.Helper()
	var want []string
	for _, p := range among {
		want = append(want, p.name)
	}
	sort.Strings(want)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tenuretest.WaitFor(wctx, t, what, func() bool {
		for _, p := range among {
			if m, ok := p.members(); !ok || !slices.Equal(m, want) {
				return false
			}
		}
		return true
	})
}

// call is one client call, as the client saw it.
type call struct {
	start, end time.Time
	id, key    string
	err        error // the last attempt's
	tries      int
	firstErr   error // the first attempt's
}

// retryFor is how long a retrying client sends a call again after its
// first attempt.
const retryFor = 30 * time.Second

// client writes through its entry nodes until ctx ends, to the key keyOf
// names for its w-th writer's i-th call: each Put carries a request id and
// a value of its own, and a 10 s deadline, longer than the pause, so the
// wait measured is the cluster's, not the deadline's. With retry, a call
// that fails is sent again, with the same request id and value, through
// the next entry, until it succeeds or retryFor has passed.
func client(ctx context.Context, w int, entries []*proc, keyOf func(w, i int) string, retry bool, calls chan<- call) {
	for i := 0; ctx.Err() == nil; i++ {
		id := fmt.Sprintf("w%d-%d", w, i)
		c := call{start: time.Now(), id: id, key: keyOf(w, i)}
		for {
			p := entries[(i+c.tries)%len(entries)]
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			cctx, _ = transport.WithRequestID(cctx, id)
			_, c.err = p.kv.Put(cctx, &kvpb.PutRequest{Key: c.key, Value: []byte(id)})
			cancel()
			if c.tries++; c.tries == 1 {
				c.firstErr = c.err
			}
			if c.err == nil || !retry || time.Since(c.start) > retryFor {
				break
			}
			pause(context.Background(), 10*time.Millisecond)
		}
		c.end = time.Now()
		calls <- c
	}
}

// TestFigures runs four kvstore nodes as processes on one SQLite file and
// clients writing through two of them, and prints the client-path figures
// (`go test ./examples/kvstore -run TestFigures/sqlite -v`):
//
//   - client.max_wait_after_sigstop_seconds: the longest any call waited
//     for its answer after an owner was stopped with SIGSTOP, beside the
//     run's failure detection and Grace (target: at most detection + Grace
//   - 0.5 s, whatever the client's deadline, here 10 s);
//   - client.failed_calls_during_leave: calls that failed while another
//     node left gracefully (SIGTERM);
//   - client.duplicate_commits: writes committed more than once, counted
//     from the database (a node is also killed with SIGKILL mid-load);
//   - client.outcome_unknown: calls answered with an unknown outcome.
//
// It asserts what does not depend on timing: no duplicate commit, no
// failed call during the leave, every acknowledged write in the database.
//
// Its second part, batched_postgres (figuresBatched), runs the same
// faults on PostgreSQL with the writes of each partition in flight
// together, and prints the batches' figures.
func TestFigures(t *testing.T) {
	t.Run("sqlite", figuresSQLite)
	t.Run("batched_postgres", figuresBatched)
}

func figuresSQLite(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ps := spawnCluster(t, dir, 4, "-data", filepath.Join(dir, "kv.db"))
	settled := func(what string, among ...*proc) { settle(ctx, t, what, among...) }
	settled("the cluster to converge", ps...)
	n0, n1, stopped, leaver := ps[0], ps[1], ps[2], ps[3]

	calls := make(chan call, 1<<16)
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); client(lctx, w, []*proc{n0, n1}, figKey, false, calls) }()
	}
	pause(ctx, time.Second)

	// A SIGSTOP of an owner, past detection and Grace.
	grace := coordinator.LocalConfig().Grace
	if err := sigstop.StopUnlocked(ctx, stopped.cmd.Process.Pid, filepath.Join(dir, "kv.db")); err != nil {
		t.Fatal(err)
	}
	tStop := time.Now()
	wctx, cancelWait := context.WithTimeout(ctx, time.Minute)
	tenuretest.WaitFor(wctx, t, "the others to drop the stopped node", func() bool {
		for _, p := range []*proc{n0, n1, leaver} {
			if m, _ := p.members(); m == nil || slices.Contains(m, stopped.name) {
				return false
			}
		}
		return true
	})
	cancelWait()
	detection := time.Since(tStop)
	settled("the others to take the stopped node's partitions over", n0, n1, leaver)
	takeover := time.Since(tStop)
	pause(ctx, grace+time.Second)
	if err := stopped.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	tCont := time.Now()
	settled("the stopped node to rejoin", ps...)
	pause(ctx, time.Second)

	// A graceful leave.
	tLeave := time.Now()
	if err := leaver.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leaver.exited:
	case <-ctx.Done():
		t.Fatal("the leaving node did not exit")
	}
	settled("the others to settle after the leave", n0, n1, stopped)
	tLeft := time.Now()
	pause(ctx, coordinator.LocalConfig().StableAfter+time.Second) // the leaver leaves the stable membership

	// A crash mid-load.
	stopped.kill()
	settled("the survivors to settle after the crash", n0, n1)
	pause(ctx, time.Second)
	stopLoad()
	wg.Wait()
	close(calls)

	var (
		acked, unknown, failedLeave, failed int
		maxWait                             time.Duration
		ackedIDs                            []string
		firstLeaveErr, firstErr             error
		worst                               call
	)
	for c := range calls {
		if c.end.After(tStop) && c.start.Before(tCont) {
			if w := c.end.Sub(later(c.start, tStop)); w > maxWait {
				maxWait = w
				worst = c
			}
		}
		switch {
		case c.err == nil:
			acked++
			ackedIDs = append(ackedIDs, c.id)
			continue
		case transport.IsOutcomeUnknown(c.err):
			unknown++
		}
		failed++
		if firstErr == nil {
			firstErr = c.err
		}
		if c.end.After(tLeave) && c.start.Before(tLeft) {
			failedLeave++
			if firstLeaveErr == nil {
				firstLeaveErr = c.err
			}
		}
	}
	db, err := kvnode.OpenDB(filepath.Join(dir, "kv.db"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, dups, err := kvnode.CountDuplicates(ctx, db, "fig/")
	if err != nil {
		t.Fatal(err)
	}
	missing, err := missingIDs(ctx, db, ackedIDs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("longest wait: call %s from %+.3fs to %+.3fs after the SIGSTOP (SIGCONT at %+.3fs): %v",
		worst.id, worst.start.Sub(tStop).Seconds(), worst.end.Sub(tStop).Seconds(), tCont.Sub(tStop).Seconds(), worst.err)
	fmt.Printf("figure: client.calls %d\n", acked+failed)
	fmt.Printf("figure: client.acked_writes %d\n", acked)
	fmt.Printf("figure: client.committed_writes %d\n", rows-dups)
	fmt.Printf("figure: client.detection_seconds %.3f\n", detection.Seconds())
	fmt.Printf("figure: client.grace_seconds %.3f\n", grace.Seconds())
	fmt.Printf("figure: client.detection_plus_grace_seconds %.3f\n", (detection + grace).Seconds())
	fmt.Printf("figure: client.takeover_seconds %.3f\n", takeover.Seconds())
	fmt.Printf("figure: client.max_wait_after_sigstop_seconds %.3f\n", maxWait.Seconds())
	fmt.Printf("figure: client.failed_calls_during_leave %d\n", failedLeave)
	fmt.Printf("figure: client.duplicate_commits %d\n", dups)
	fmt.Printf("figure: client.outcome_unknown %d\n", unknown)
	fmt.Printf("figure: client.failed_calls %d\n", failed)
	if dups != 0 || missing != 0 {
		t.Errorf("%d writes committed twice, %d acknowledged writes not in the database", dups, missing)
	}
	if failedLeave != 0 {
		t.Errorf("%d calls failed during the graceful leave; first: %v", failedLeave, firstLeaveErr)
	}
	if failed != 0 {
		t.Logf("%d calls failed in all (%d with an unknown outcome); first: %v", failed, unknown, firstErr)
	}
}

// figKey is TestFigures' key: 16 keys per writer.
func figKey(w, i int) string { return fmt.Sprintf("fig/w%d/k%d", w, i%16) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// missingIDs counts the acknowledged request ids with no record in kv_log.
func missingIDs(ctx context.Context, db *sql.DB, ids []string) (int, error) {
	rs, err := db.QueryContext(ctx, `SELECT request_id FROM kv_log WHERE request_id IS NOT NULL`)
	if err != nil {
		return 0, err
	}
	defer rs.Close()
	logged := map[string]bool{}
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			return 0, err
		}
		logged[id] = true
	}
	if err := rs.Err(); err != nil {
		return 0, err
	}
	missing := 0
	for _, id := range ids {
		if !logged[id] {
			missing++
		}
	}
	return missing, nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
