package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
)

// sigCluster is a 3-node cluster on one SQLite file: two nodes in this
// process and one, the child, in a process of its own that a fault can
// stop, pause or load; every node writes to the partitions it holds, and
// every operation and claim is recorded for the checks.
type sigCluster struct {
	t     *testing.T
	path  string
	place sigPlace
	res   *sqlResource
	hist  *History
	auth  *recAuthority
	nodes []*coordinator.Coordinator // in this process

	pid    int
	stderr *lockedBuffer
	stdin  io.WriteCloser
	reap   func() error

	mu        sync.Mutex
	childRecs []Record
	childCl   []claimRec

	stale    atomic.Int64
	stopLoad context.CancelFunc
	load     sync.WaitGroup
}

// childName is the child's node name.
const childName = "n2"

// sigPlace is where the cluster runs. The zero value is loopback and one
// SQLite file; the netsplit run puts the child in a network namespace and
// the data in PostgreSQL.
type sigPlace struct {
	bind, childBind string // gossip bind addresses: this process's nodes', the child's ("": loopback)
	dsn, childDSN   string // PostgreSQL for this process and for the child ("": the SQLite file)
	// command starts the child's program (nil: exec.Command).
	command func(name string, args ...string) *exec.Cmd
}

// startSigCluster starts the cluster on loopback and one SQLite file.
func startSigCluster(ctx context.Context, t *testing.T, seed uint64) *sigCluster {
	t.Helper()
	return startSigClusterAt(ctx, t, seed, sigPlace{})
}

// startSigClusterAt starts the cluster at place and its workload, and
// returns once the child has made 20 writes. Everything it starts ends
// when the test does.
func startSigClusterAt(ctx context.Context, t *testing.T, seed uint64, place sigPlace) *sigCluster {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5165))
	s := &sigCluster{t: t, path: filepath.Join(t.TempDir(), "chaos.db"), hist: NewHistory(nil), stderr: &lockedBuffer{}, place: place}
	db, err := openPlaceSQL(s.path, place.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if s.res, err = newPlaceResource(ctx, db, place.dsn, true, s.hist); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.res.close)
	s.auth = &recAuthority{a: s.res.f.Authority(), hist: s.hist}
	for i := range 2 {
		var seeds []string
		if i > 0 {
			seeds = []string{s.nodes[0].GossipAddr()}
		}
		cfg := sigConfig(fmt.Sprintf("n%d", i), s.res, s.auth, seeds, rand.New(rand.NewPCG(rng.Uint64(), uint64(time.Now().UnixNano()))))
		if place.bind != "" {
			cfg.BindAddr = place.bind
		}
		c, err := coordinator.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		s.nodes = append(s.nodes, c)
	}
	s.startChild(ctx)

	wctx, stop := context.WithCancel(ctx)
	s.stopLoad = stop
	for i, c := range s.nodes {
		s.load.Add(1)
		go func() {
			defer s.load.Done()
			writeLoop(wctx, c, s.res, s.hist, c.Self().Name, i+2, &s.stale)
		}()
	}
	t.Cleanup(func() { stop(); s.load.Wait() })
	if !waitFor(ctx, 30*time.Second, func() bool { return s.childStats(OK) >= 20 }) {
		t.Fatalf("the child made no writes; stderr:\n%s", s.stderr.String())
	}
	return s
}

// startChild starts the child node's process and waits until it is ready.
func (s *sigCluster) startChild(ctx context.Context) {
	t := s.t
	command := exec.Command
	if s.place.command != nil {
		command = s.place.command
	}
	cmd := command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childDBEnv+"="+s.path, childSeedEnv+"="+s.nodes[0].GossipAddr(), childNameEnv+"="+childName,
		childDSNEnv+"="+s.place.childDSN, childBindEnv+"="+s.place.childBind)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = s.stderr
	var err error
	if s.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.pid = cmd.Process.Pid
	ready := make(chan string, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			var l childLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			s.mu.Lock()
			switch {
			case l.Ready != "":
				ready <- l.Ready
			case l.Rec != nil:
				s.childRecs = append(s.childRecs, *l.Rec)
			case l.Claim != nil:
				s.childCl = append(s.childCl, *l.Claim)
			}
			s.mu.Unlock()
		}
	}()
	var waitOnce sync.Once
	var waitErr error
	s.reap = func() error {
		waitOnce.Do(func() {
			<-readDone // Wait closes stdout: read everything first
			waitErr = cmd.Wait()
		})
		return waitErr
	}
	pid := s.pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // the whole process group, stopped or not
		_ = s.reap()
	})
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatalf("the child never became ready; stderr:\n%s", s.stderr.String())
	}
}

// childStats counts the child's operations with outcome out.
func (s *sigCluster) childStats(out Outcome) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.childRecs {
		if r.Out == out {
			n++
		}
	}
	return n
}

// finish waits until the in-process nodes have converged, stops the
// workload and the child, and checks the history: porcupine's fenced
// register, S1 at the resource, S2 and S4. The result is named name, with
// events nemesis events.
func (s *sigCluster) finish(ctx context.Context, name string, events int) result {
	t := s.t
	for _, c := range s.nodes {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.WaitConverged(wctx)
		wcancel()
		if err != nil {
			t.Errorf("%s: %v", c.Self().Name, err)
		}
	}
	s.stopLoad()
	s.load.Wait()
	_ = s.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- s.reap() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("child: %v; stderr:\n%s", err, s.stderr.String())
		}
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.pid, syscall.SIGKILL)
		<-exited
		t.Error("the child did not exit within 15 s of its stdin closing")
	}
	s.mu.Lock()
	recs := append(s.hist.Records(), s.childRecs...)
	claims := append(s.auth.claims(), s.childCl...)
	s.mu.Unlock()
	r := result{name: name, events: events, operations: len(recs), calls: len(recs), stale: s.stale.Load() + int64(s.childStats(Stale))}
	chk, err := Check(recs, 30*time.Second, os.TempDir())
	if err != nil {
		r.violations = append(r.violations, fmt.Sprintf("check: %v", err))
	}
	for _, p := range chk.Illegal {
		r.violations = append(r.violations, fmt.Sprintf("linearizability: partition %d is not a fenced register (porcupine)", p))
	}
	for _, p := range chk.Undecided {
		r.violations = append(r.violations, fmt.Sprintf("linearizability: porcupine timed out on partition %d", p))
	}
	if chk.Visualization != "" {
		t.Logf("porcupine visualization: %s", chk.Visualization)
	}
	s1, err := s.res.s1(ctx)
	if err != nil {
		r.violations = append(r.violations, fmt.Sprintf("S1 check: %v", err))
	}
	r.violations = append(r.violations, s1Strings(s1)...)
	r.violations = append(r.violations, checkS2(recs)...)
	r.violations = append(r.violations, checkS4(claims)...)
	return r
}
