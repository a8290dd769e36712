package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/internal/sigstop"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

// The child process: TestMain runs childMain instead of the tests when
// childEnv is set. It is a cluster node like the example node: a
// coordinator whose partitions are fenced in the shared SQLite file by the
// SQL fence and authority, writing to every partition it owns, and
// printing every operation and claim as a JSON line on stdout.
const (
	childEnv      = "TENURE_CHAOS_CHILD"
	childDBEnv    = "TENURE_CHAOS_DB"
	childSeedEnv  = "TENURE_CHAOS_SEEDS"
	childNameEnv  = "TENURE_CHAOS_NAME"
	childDSNEnv   = "TENURE_CHAOS_DSN"  // PostgreSQL instead of the SQLite file
	childBindEnv  = "TENURE_CHAOS_BIND" // the gossip bind address, if not loopback
	sigPartitions = 16
)

// childLine is one line of the child's stdout.
type childLine struct {
	Ready string    `json:"ready,omitempty"`
	Rec   *Record   `json:"rec,omitempty"`
	Claim *claimRec `json:"claim,omitempty"`
}

func childMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(l childLine) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		return 1
	}
	db, err := openPlaceSQL(os.Getenv(childDBEnv), os.Getenv(childDSNEnv))
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	h := NewHistory(func(r Record) { emit(childLine{Rec: &r}) })
	res, err := newPlaceResource(ctx, db, os.Getenv(childDSNEnv), false, h)
	if err != nil {
		return fail(err)
	}
	defer res.close()
	auth := &recAuthority{a: res.f.Authority(), hist: h, sink: func(c claimRec) { emit(childLine{Claim: &c}) }}
	name := os.Getenv(childNameEnv)
	cfg := sigConfig(name, res, auth, []string{os.Getenv(childSeedEnv)}, nil)
	if bind := os.Getenv(childBindEnv); bind != "" {
		cfg.BindAddr = bind
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		return fail(err)
	}
	emit(childLine{Ready: c.GossipAddr()})
	// Run until the parent closes stdin (or the deadline).
	wctx, stop := context.WithCancel(ctx)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	var stale atomic.Int64
	writeLoop(wctx, c, res, h, name, 1, &stale)
	return 0
}

// sigConfig is the configuration of every node of the SIGSTOP cluster.
func sigConfig(name string, res *sqlResource, auth *recAuthority, seeds []string, rng *rand.Rand) coordinator.Config {
	cfg := coordinator.LocalConfig()
	cfg.Name = name
	cfg.Ring = ring.Config{Partitions: sigPartitions, VirtualNodes: ring.DefaultConfig().VirtualNodes, Load: ring.DefaultConfig().Load}
	cfg.Rand = rng
	cfg.Fence = res
	cfg.Authority = auth
	cfg.Handler = coordinator.HandlerFuncs{}
	cfg.Seeds = seeds
	return cfg
}

// writeLoop writes to every partition the node holds a lease on, every
// few milliseconds, through the public API (Lease, the token, the fence),
// one read for three writes, until ctx ends. A stale rejection is
// reported to the coordinator, which ends the lease.
func writeLoop(ctx context.Context, c *coordinator.Coordinator, res *sqlResource, h *History, name string, client int, stale *atomic.Int64) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for p := range uint32(sigPartitions) {
			l, err := c.LeaseOfPartition(p)
			if err != nil {
				continue
			}
			t := l.Token()
			rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			rec := Record{Client: client, Node: name, Kind: Write, Token: t, Start: Now()}
			if (seq+int(p))%4 == 0 {
				rec.Kind = Read
				rec.OutToken, rec.OutValue, err = res.read(rctx, t)
			} else {
				rec.Value = fmt.Sprintf("%s-%d-%d", name, seq, p)
				err = res.write(rctx, t, rec.Value)
			}
			cancel()
			rec.End, rec.Out = Now(), classify(err)
			if rec.Kind == Read && rec.Out != OK {
				rec.OutToken, rec.OutValue = ownership.Token{}, ""
			}
			h.Add(rec)
			if rec.Out == Stale {
				stale.Add(1)
				c.ReportStale(err)
			}
		}
	}
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// runSIGSTOP runs a 3-node cluster, two nodes in this process and one in a
// child process, on one SQLite file; stops the child with SIGSTOP past its
// lease until the others have fenced all its partitions, resumes it with
// SIGCONT, and checks that its late writes were rejected and the history
// is a fenced register.
func runSIGSTOP(t *testing.T, seed uint64) result {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := startSigCluster(ctx, t, seed)
	owned := s.childOwned(ctx)
	// Stop it past its lease, until every partition it held is fenced by
	// another node; at a moment it holds no SQLite write lock, which would
	// stop every writer of the file, the new owners' fences included.
	if err := sigstop.StopUnlocked(ctx, s.pid, s.path); err != nil {
		t.Fatalf("stop the child: %v", err)
	}
	stopped := time.Now()
	taken := s.takenOver(ctx, owned)
	if err := syscall.Kill(s.pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !taken {
		t.Fatalf("the others did not take over the child's partitions %v within 30 s:\n%s", owned, sigDiagnosis(ctx, s.res, s.auth, s.nodes, owned))
	}
	t.Logf("sigstop: child %s (pid %d) stopped %v, its %d partitions fenced by others, continued",
		childName, s.pid, time.Since(stopped).Round(time.Millisecond), len(owned))
	// Its late writes meet the fence.
	if !waitFor(ctx, 20*time.Second, func() bool { return s.childStats(Stale) > 0 }) {
		t.Errorf("the child's late writes were never rejected (it made %d writes)", s.childStats(OK))
	}
	return s.finish(ctx, "sigstop", 1)
}

// childOwned returns the partitions whose fence mark the child holds; it
// fails the test if there are none.
func (s *sigCluster) childOwned(ctx context.Context) []uint32 {
	var owned []uint32
	for p := range uint32(sigPartitions) {
		if m, err := s.res.mark(ctx, p); err == nil && m.Owner == childName {
			owned = append(owned, p)
		}
	}
	if len(owned) == 0 {
		s.t.Fatal("the child owns no partition")
	}
	return owned
}

// takenOver waits up to 30 s until another node has fenced every one of
// owned, and reports whether one has.
func (s *sigCluster) takenOver(ctx context.Context, owned []uint32) bool {
	return waitFor(ctx, 30*time.Second, func() bool {
		for _, p := range owned {
			if m, err := s.res.mark(ctx, p); err != nil || m.Owner == childName {
				return false
			}
		}
		return true
	})
}

// sigDiagnosis describes, for a failed takeover, what each in-process node
// sees of the partitions and what the authority answered them.
func sigDiagnosis(ctx context.Context, res *sqlResource, auth *recAuthority, nodes []*coordinator.Coordinator, owned []uint32) string {
	var b strings.Builder
	for _, c := range nodes {
		st := c.Status()
		var members []string
		for _, m := range st.Members {
			members = append(members, m.Name)
		}
		fmt.Fprintf(&b, "%s: members %v, converged %v\n", st.Node, members, st.Converged)
		for _, p := range owned {
			if int(p) < len(st.Partitions) {
				fmt.Fprintf(&b, "  %+v\n", st.Partitions[p])
			}
		}
	}
	for _, p := range owned {
		m, err := res.mark(ctx, p)
		fmt.Fprintf(&b, "partition %d: mark %v (%v)\n", p, m, err)
	}
	claims := auth.claims()
	for _, c := range claims[max(0, len(claims)-10):] {
		fmt.Fprintf(&b, "claim %v: %s\n", c.Token, c.Err)
	}
	return b.String()
}
