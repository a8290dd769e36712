package coordinator

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gometrics "github.com/hashicorp/go-metrics"
	"github.com/tenure-go/tenure/internal/slowtest"
)

var (
	joinDiag           = flag.Int("joindiag", 0, "TestJoinDiag starts this many nodes x 271 partitions through one seed and logs what each start cost (without it, 5 nodes, and no idle windows)")
	joinDiagProf       = flag.String("joindiag.cpu", "", "TestJoinDiag: write a CPU profile of the whole run (starts, convergence, idle windows) to this file")
	joinDiagDumps      = flag.String("joindiag.dumps", "", "TestJoinDiag: write a goroutine dump of every start slower than 8 s into this directory")
	joinDiagNoCompress = flag.Bool("joindiag.nocompress", false, "TestJoinDiag: memberlist sends without compression (EnableCompression off)")
)

// diagHandler counts log records by node and message, memberlist's
// [ERR]/[WARN] lines by their text's head.
type diagHandler struct {
	mu     sync.Mutex
	counts map[string]int
	last   map[string]string
}

type diagH struct {
	s    *diagHandler
	node string
}

func (h diagH) Enabled(context.Context, slog.Level) bool { return true }
func (h diagH) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	key, text := "", ""
	if i := strings.Index(msg, "memberlist:"); i >= 0 {
		j := strings.Index(msg, "[")
		if j < 0 {
			return nil
		}
		msg = msg[j:]
		if !strings.HasPrefix(msg, "[ERR]") && !strings.HasPrefix(msg, "[WARN]") {
			return nil
		}
		text = msg
		if len(msg) > 60 {
			msg = msg[:60]
		}
		key = "ml " + msg
	} else {
		if r.Level < slog.LevelInfo {
			return nil
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				text = a.Value.String()
			}
			return true
		})
		key = h.node + " " + msg
	}
	h.s.mu.Lock()
	h.s.counts[key]++
	if text != "" {
		h.s.last[key] = text
	}
	h.s.mu.Unlock()
	return nil
}
func (h diagH) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		if a.Key == "node" {
			h.node = a.Value.String()
		}
	}
	return h
}
func (h diagH) WithGroup(string) slog.Handler { return h }

func (h *diagHandler) snapshot() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.counts))
	for k, v := range h.counts {
		out[k] = v
	}
	return out
}

// countSink counts go-metrics counters by key (memberlist's).
type countSink struct {
	mu sync.Mutex
	m  map[string]float64
}

func (s *countSink) SetGauge([]string, float32)                               {}
func (s *countSink) SetGaugeWithLabels([]string, float32, []gometrics.Label)  {}
func (s *countSink) EmitKey([]string, float32)                                {}
func (s *countSink) AddSample([]string, float32)                              {}
func (s *countSink) AddSampleWithLabels([]string, float32, []gometrics.Label) {}
func (s *countSink) IncrCounterWithLabels(k []string, v float32, _ []gometrics.Label) {
	s.IncrCounter(k, v)
}
func (s *countSink) IncrCounter(k []string, v float32) {
	s.mu.Lock()
	s.m[strings.Join(k, ".")] += float64(v)
	s.mu.Unlock()
}
func (s *countSink) snap() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]float64{}
	for k, v := range s.m {
		out[k] = v
	}
	return out
}
func (s *countSink) diff(before map[string]float64) string {
	var out []string
	for k, v := range s.snap() {
		if d := v - before[k]; d > 0 && !strings.Contains(k, "runtime") {
			out = append(out, fmt.Sprintf("%s=%.0f", strings.TrimPrefix(k, "x.memberlist."), d))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// cpuNow is the CPU time (user and system) this process has used.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestJoinDiag is the diagnostic of issue 22, item 4 (100 coordinators
// in one process don't converge), behind -joindiag N: it starts N nodes x
// 271 partitions, each joining node 0 as TestScale's do, and logs for
// each start its wall and process CPU time, what the cluster sent
// meanwhile (traffic counters), memberlist's own counters (go-metrics,
// through a sink installed for the run: msg.alive is an alive message
// that changed a node's record, one per node per metadata update or
// refutation; msg.suspect, msg.dead, tcp.accept) and memberlist's
// [ERR]/[WARN] lines counted by kind; then the time to converge and the
// process's idle CPU over three 3 s windows, and what one more join into
// the quiet cluster cost. Without the flag it runs 5 nodes, skips the
// idle windows, and asserts what holds at any size and whatever the
// cluster's gossip costs: the cluster converges, after the join too; every
// start and the join carried a join's push/pull (states, stream bytes),
// and the join changed the joiner's alive record at every member
// (memberlist's msg.alive at least n+1). It asserts no upper bound: the
// counts are the diagnostic's, and its figures are TestScale10x271's
// (scale.10x271.join_syncs, join_meta_updates).
//
//	go test ./coordinator -run 'TestJoinDiag$' -v -timeout 14m -args -joindiag 30 -joindiag.cpu /tmp/cpu.prof
//
// What it showed (December 2026, 2 cores at load averages of 14-35, the
// test process getting 0.3-0.4 of a core): per join, the stable
// membership changes and about 0.7 n nodes re-advertise it in their
// metadata (an alive message each, relayed by every node), so about
// 0.6 n^2 alive records change per join (122 a start at n = 10-19, 373
// at 20-29), and the nodes that see a member's newer stable ID before the
// joiner itself sync with it (a join-type push/pull, whole register and
// all n member states both ways): 5 a start at n = 10-19, 19 at 20-29.
// One join into a quiet cluster of n (-joindiag 5, 10, 15, 20):
// metadata updates 6, 11, 16, 21 (n+1: every node re-advertises the new
// stable ID once), syncs 3, 9, 13, 17 (~0.85 n), alive records changed
// 41, 142, 1011, 1239 (~1.4 n^2 when quiet; at 15 and 20 the join's
// burst set off 744 and 717 suspicions and 208 and 110 dead records), UDP
// bytes 36 KB, 124 KB, 1.07 MB, 1.08 MB, CPU 0.08, 0.17, 3.06, 1.72 s.
// A start costs the cluster O(n^2), the whole run O(n^3). Idle, a node
// costs about 0.01 core (LZW compression of every gossip packet 13%,
// Machine.Tick 12%). Once the process's demand passes its share of the
// CPU, probes time out: nodes are suspected and declared dead, refute
// (more alive messages), memberlist's handler queue (1024) overflows
// (51,090 user, 2,187 dead and 1,860 suspect messages dropped during one
// start at n = 50), the seed's push/pull streams time out before their
// first byte is read (TCPTimeout 2 s; 273 in that start), the joiner
// retries with backoff (15 tries, 101 s) and the loop's rejoins add
// push/pulls: the collapse the issue saw from node 45 on.
func TestJoinDiag(t *testing.T) {
	n, deep := *joinDiag, *joinDiag > 0
	if !deep {
		n = 5
	}
	ctx, cancel := slowtest.WithTimeout(context.Background(), 13*time.Minute)
	defer cancel()
	h := &diagHandler{counts: map[string]int{}, last: map[string]string{}}
	sink := &countSink{m: map[string]float64{}}
	mc := gometrics.DefaultConfig("x")
	mc.EnableHostname, mc.EnableRuntimeMetrics = false, false
	if _, err := gometrics.NewGlobal(mc, sink); err != nil {
		t.Fatal(err)
	}
	// go-metrics' sink is global: the next tests get go-metrics' own
	// default back, a sink that drops everything (no runtime metrics, so
	// no goroutine).
	defer func() {
		rc := gometrics.DefaultConfig("")
		rc.EnableHostname, rc.EnableRuntimeMetrics = false, false
		_, _ = gometrics.NewGlobal(rc, &gometrics.BlackholeSink{})
	}()
	if f := *joinDiagProf; f != "" {
		pf, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			t.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); pf.Close() }()
	}
	sc := newScaleCluster(t, 271)
	begin := time.Now()
	for i := range n {
		cfg := testConfig(fmt.Sprintf("s%d", i))
		cfg.Ring.Partitions = 271
		cfg.Handler = nopHandler{}
		cfg.Fence = sc.fence
		cfg.Logger = slog.New(diagH{s: h})
		cfg.Memberlist.EnableCompression = !*joinDiagNoCompress
		if i > 0 {
			cfg.Seeds = []string{sc.nodes[0].GossipAddr()}
		}
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		before := h.snapshot()
		tr0, ms0 := sc.traffic(), sink.snap()
		t0, cpu0 := time.Now(), cpuNow()
		done := make(chan error, 1)
		go func() { done <- c.Start(ctx) }()
		dumped := false
		var err2 error
	wait:
		for {
			select {
			case err2 = <-done:
				break wait
			case <-time.After(8 * time.Second):
				if !dumped && *joinDiagDumps != "" {
					dumped = true
					if f, err := os.Create(fmt.Sprintf("%s/goroutines-start%d.txt", *joinDiagDumps, i)); err == nil {
						_ = pprof.Lookup("goroutine").WriteTo(f, 1)
						f.Close()
					}
				}
			}
		}
		if err2 != nil {
			t.Fatalf("start %d: %v", i, err2)
		}
		took := time.Since(t0)
		sc.nodes = append(sc.nodes, c)
		after := h.snapshot()
		var diff []string
		for k, v := range after {
			if d := v - before[k]; d > 0 && (strings.HasPrefix(k, "ml ") || strings.Contains(k, "join") || strings.HasPrefix(k, fmt.Sprintf("s%d ", i))) {
				diff = append(diff, fmt.Sprintf("%q x%d", k, d))
			}
		}
		sort.Strings(diff)
		tr := sc.traffic().minus(tr0)
		cpu := cpuNow() - cpu0
		t.Logf("start %d: %.2fs cpu %.2fs at %.1fs; syncs %d meta %d states %d stateKB %d streamKB %d packetKB %d queued %d bcastKB %d; logs: %s", i, took.Seconds(), cpu.Seconds(), time.Since(begin).Seconds(),
			tr.syncs, tr.metaUpdates, tr.states, tr.stateBytes>>10, tr.streamBytes>>10, tr.packetBytes>>10, tr.queued, tr.sentBcast>>10, strings.Join(diff, ", "))
		t.Logf("   ml %d: %s", i, sink.diff(ms0))
		if i > 0 && (tr.states == 0 || tr.streamBytes == 0) {
			t.Errorf("start %d joined with no push/pull: states %d, stream bytes %d", i, tr.states, tr.streamBytes)
		}
	}
	t.Logf("all started at %.1fs", time.Since(begin).Seconds())
	for k := 0; ; k++ {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err := sc.waitConverged(wctx)
		wcancel()
		if err == nil {
			break
		}
		t.Logf("at %.1fs: %v", time.Since(begin).Seconds(), err)
		if k == 8 {
			t.Fatal("gave up")
		}
	}
	t.Logf("converged at %.1fs", time.Since(begin).Seconds())
	for k := 0; deep && k < 3; k++ {
		tr0, c0, w0 := sc.traffic(), cpuNow(), time.Now()
		select { // a measurement window, not a wait for a condition
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		tr := sc.traffic().minus(tr0)
		w := time.Since(w0).Seconds()
		t.Logf("idle: cpu %.2f cores; per node per s: packets KB %.1f, stream KB %.1f, states %.2f, bcast KB %.2f, queued %.2f", (cpuNow()-c0).Seconds()/w,
			float64(tr.packetBytes)/1024/w/float64(n), float64(tr.streamBytes)/1024/w/float64(n), float64(tr.states)/w/float64(n), float64(tr.sentBcast)/1024/w/float64(n), float64(tr.queued)/w/float64(n))
	}
	// One more node joins the quiet cluster: what that join cost, until
	// converged and no broadcast is left queued.
	tr0, ms0, c0, w0 := sc.traffic(), sink.snap(), cpuNow(), time.Now()
	if err := sc.start(ctx); err != nil {
		t.Fatalf("join: %v", err)
	}
	if err := sc.waitConverged(ctx); err != nil {
		t.Fatalf("after the join: %v", err)
	}
	if err := sc.waitQuiet(ctx); err != nil {
		t.Fatalf("after the join: %v", err)
	}
	tr := sc.traffic().minus(tr0)
	t.Logf("join into %d quiet: %.2fs cpu %.2fs; syncs %d meta %d states %d streamKB %d packetKB %d queued %d", n, time.Since(w0).Seconds(), (cpuNow() - c0).Seconds(),
		tr.syncs, tr.metaUpdates, tr.states, tr.streamBytes>>10, tr.packetBytes>>10, tr.queued)
	t.Logf("join into %d quiet, ml: %s", n, sink.diff(ms0))
	if tr.states == 0 || tr.streamBytes == 0 {
		t.Errorf("the join into %d quiet nodes carried no push/pull: states %d, stream bytes %d", n, tr.states, tr.streamBytes)
	}
	if alive := sink.snap()["x.memberlist.msg.alive"] - ms0["x.memberlist.msg.alive"]; alive < float64(n+1) {
		t.Errorf("the join into %d quiet nodes changed %.0f alive records, want at least %d (the joiner's, at every member and itself)", n, alive, n+1)
	}
	h.mu.Lock()
	for k, v := range h.last {
		if strings.HasPrefix(k, "ml ") {
			t.Logf("last %q: %s (x%d)", k, v, h.counts[k])
		}
	}
	h.mu.Unlock()
}
