package chaos

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

var (
	flagSeed = flag.Uint64("chaos.seed", 0, "replay the runs of this logged seed (0: a new seed)")
	flagLong = flag.Bool("chaos.long", false, "the long run: many more nemesis events (also TENURE_CHAOS_LONG=1)")
)

// TestChaos runs the suite: the memory resource, the SQL resource with the
// SQL authority, the negative control (the memory run with fencing off,
// which must be caught), and a real child process paused with SIGSTOP.
func TestChaos(t *testing.T) {
	long := *flagLong || os.Getenv("TENURE_CHAOS_LONG") != ""
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run TestChaos -v ./internal/chaos/ -chaos.seed=%d)", seed, seed)
	memEvents, sqlEvents := 10, 4
	if long {
		memEvents, sqlEvents = 60, 20
	}
	t.Run("memory", func(t *testing.T) {
		r := runChaos(t, runConfig{name: "memory", nodes: 5, partitions: 32, clients: 6, events: memEvents, fencing: true, seed: seed})
		r.print("violations")
		r.fail(t)
	})
	t.Run("sql", func(t *testing.T) {
		r := runChaos(t, runConfig{name: "sql", nodes: 5, partitions: 16, clients: 4, events: sqlEvents, fencing: true, sql: true, seed: seed})
		r.print("violations")
		r.fail(t)
	})
	t.Run("control", func(t *testing.T) {
		// The memory run's first events (the same seed), fencing off.
		r := runChaos(t, runConfig{name: "control", nodes: 5, partitions: 32, clients: 6, events: 2, fencing: false, seed: seed})
		r.print("control_violations")
		if len(r.violations) == 0 {
			t.Fatal("the negative control (fencing off) was not reported as violating")
		}
		for i, v := range r.violations {
			if i == 5 {
				break
			}
			t.Logf("control violation (expected): %s", v)
		}
	})
	t.Run("sigstop", func(t *testing.T) {
		r := runSIGSTOP(t, seed)
		r.print("violations")
		r.fail(t)
	})
}

// result is what one run found.
type result struct {
	name       string
	events     int
	operations int
	calls      int
	stale      int64
	violations []string
}

func (r result) print(violationsName string) {
	fmt.Printf("run %s:\n", r.name)
	fmt.Printf("figure: chaos.nemesis_events %d\n", r.events)
	fmt.Printf("figure: chaos.operations %d\n", r.operations)
	fmt.Printf("figure: chaos.stale_rejected %d\n", r.stale)
	fmt.Printf("figure: chaos.%s %d\n", violationsName, len(r.violations))
}

func (r result) fail(t *testing.T) {
	t.Helper()
	t.Logf("%s: %d nemesis events, %d client calls, %d operations at the resource, %d stale rejected",
		r.name, r.events, r.calls, r.operations, r.stale)
	if len(r.violations) == 0 {
		return
	}
	for i, v := range r.violations {
		if i == 20 {
			t.Errorf("... and %d more", len(r.violations)-i)
			break
		}
		t.Errorf("violation: %s", v)
	}
}

// nemesis kinds, drawn by the schedule.
var nemeses = []string{"pause", "partition", "bridge", "oneway", "lossy", "crash", "restart-new-addr", "clock", "ambiguous"}

// schedule draws n nemesis kinds: first the deterministic stale write,
// then every kind once in a random order, again and again.
func schedule(rng *rand.Rand, n int) []string {
	out := []string{"pause"}
	for len(out) < n {
		for _, i := range rng.Perm(len(nemeses)) {
			out = append(out, nemeses[i])
		}
	}
	return out[:n]
}

// runChaos runs one configuration: start the cluster, run the workload
// through a seeded schedule of nemesis events (each healed and settled),
// read every partition at the end, and check the history.
func runChaos(t *testing.T, cfg runConfig) result {
	budget := 90*time.Second + time.Duration(cfg.events)*30*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	dir := t.TempDir()
	var sqlDB *sql.DB
	cl := newCluster(t, cfg, func(cl *cluster) resource {
		if !cfg.sql {
			r, err := newMemResource(cfg.partitions, cfg.fencing, cl.hist, cl.onFence)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		db, err := openSQL(filepath.Join(dir, "chaos.db"))
		if err != nil {
			t.Fatal(err)
		}
		sqlDB = db
		r, err := newSQLResource(ctx, db, true, cl.hist, cl.onFence)
		if err != nil {
			t.Fatal(err)
		}
		cl.auth = &recAuthority{a: r.f.Authority()}
		return r
	})
	if sqlDB != nil {
		t.Cleanup(func() {
			cl.res.(*sqlResource).close()
			_ = sqlDB.Close()
		})
	}
	for i := range cfg.nodes {
		cl.start(ctx, fmt.Sprintf("n%d", i), "")
	}
	if d, err := cl.waitSettled(ctx, 60*time.Second); err != nil {
		t.Fatalf("the cluster never settled: %v", err)
	} else {
		t.Logf("%s: %d nodes settled in %v", cfg.name, cfg.nodes, d)
	}
	cl.findKeys()
	wctx, stopLoad := context.WithCancel(ctx)
	waitLoad := cl.workload(wctx)
	defer func() { stopLoad(); waitLoad() }()
	if !waitFor(ctx, 20*time.Second, func() bool { return len(cl.hist.Records()) > 50 }) {
		t.Fatal("the workload made no progress")
	}

	events := 0
	for i, kind := range schedule(cl.rng, cfg.events) {
		desc := cl.nemesis(ctx, kind)
		events++
		before := cl.marks(ctx)
		cl.heal()
		d, err := cl.waitSettled(ctx, 30*time.Second)
		if err != nil {
			cl.violation("after healing %s: no single owner per partition: %v", desc, err)
			t.Logf("event %d: %s; NOT settled: %v", i, desc, err)
			break
		}
		t.Logf("event %d: %s; healed, settled in %v", i, desc, d.Round(time.Millisecond))
		after := cl.marks(ctx)
		for p := range before {
			if n := after[p].Epoch - before[p].Epoch; n > 3 {
				cl.violation("duel after %s: partition %d took %d epochs to settle", desc, p, n)
			}
		}
	}
	stopLoad()
	waitLoad()
	cl.finalReads(ctx)
	cl.openStop()
	res := result{name: cfg.name, events: events, stale: cl.stale.Load()}
	res.violations, res.operations = cl.check(ctx, cfg.fencing)
	cl.mu.Lock()
	res.calls = len(cl.ops)
	cl.mu.Unlock()
	return res
}

// marks returns every partition's mark.
func (cl *cluster) marks(ctx context.Context) []ownership.Token {
	out := make([]ownership.Token, cl.cfg.partitions)
	for p := range out {
		out[p], _ = cl.res.mark(ctx, uint32(p))
	}
	return out
}

// heal removes every fault: network, gates, clock rates, lost answers.
func (cl *cluster) heal() {
	cl.net.Heal()
	for _, n := range cl.live() {
		n.gate.open()
		n.clock.SetRate(1)
		n.ambiguous.Store(false)
	}
}

func (cl *cluster) pick() *node {
	live := cl.live()
	return live[cl.rng.IntN(len(live))]
}

func (cl *cluster) shuffled() []string {
	names := cl.names()
	cl.rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	return names
}

func (cl *cluster) faultTime() time.Duration {
	return 2*time.Second + time.Duration(cl.rng.IntN(2000))*time.Millisecond
}

// nemesis applies one fault and holds it; heal comes after.
func (cl *cluster) nemesis(ctx context.Context, kind string) string {
	t := cl.t
	switch kind {
	case "pause":
		return cl.pausePastLease(ctx)
	case "partition":
		s := cl.shuffled()
		d := cl.faultTime()
		if err := cl.net.Partition(s[:2], s[2:]); err != nil {
			t.Fatal(err)
		}
		hold(ctx, d)
		return fmt.Sprintf("partition %v|%v for %v", s[:2], s[2:], d)
	case "bridge":
		s := cl.shuffled()
		d := cl.faultTime()
		if err := cl.net.Partition(s[1:3], s[3:]); err != nil {
			t.Fatal(err)
		}
		hold(ctx, d)
		return fmt.Sprintf("partition %v|%v bridged by %s for %v", s[1:3], s[3:], s[0], d)
	case "oneway":
		s := cl.shuffled()
		d := cl.faultTime()
		to := s[1:2]
		if cl.rng.IntN(2) == 0 {
			to = s[1:] // it hears everyone, no one hears it
		}
		for _, b := range to {
			cl.net.Cut(s[0], b)
		}
		hold(ctx, d)
		return fmt.Sprintf("one-way cut %s -> %v for %v", s[0], to, d)
	case "lossy":
		d := cl.faultTime()
		if err := errors.Join(cl.net.Drop(0.2), cl.net.Delay(15*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		hold(ctx, d)
		return fmt.Sprintf("20%% drops and 15 ms delays for %v", d)
	case "crash", "restart-new-addr":
		n := cl.pick()
		d := time.Duration(500+cl.rng.IntN(2500)) * time.Millisecond
		addr := n.addr
		if kind == "restart-new-addr" {
			addr = ""
		}
		n.crash()
		hold(ctx, d)
		m := cl.start(ctx, n.name, addr)
		return fmt.Sprintf("%s crashed for %v, restarted at %s (incarnation %016x)", n.name, d, m.addr, m.c.Self().Incarnation)
	case "clock":
		n := cl.pick()
		d := cl.faultTime()
		var what string
		switch cl.rng.IntN(3) {
		case 0:
			n.clock.SetRate(4)
			what = "4x fast"
		case 1:
			n.clock.SetRate(0.25)
			what = "4x slow"
		default:
			n.clock.Jump(20 * time.Second)
			n.clock.SetRate(2)
			what = "jumps 20 s, then 2x fast"
		}
		hold(ctx, d)
		return fmt.Sprintf("%s's clock %s for %v", n.name, what, d)
	case "ambiguous":
		d := cl.faultTime()
		for _, n := range cl.live() {
			n.ambiguous.Store(true)
		}
		hold(ctx, d)
		return fmt.Sprintf("30%% of applied writes lose their answer for %v", d)
	}
	t.Fatalf("unknown nemesis %q", kind)
	return ""
}

// pausePastLease is the deterministic stale write: the owner of a
// partition holds a write at its gate (token attached, not yet sent), is
// cut off until another node has fenced the partition and written under
// its own token, then the held write goes on. A fenced resource must
// reject it; an unfenced one applies it over the newer write.
func (cl *cluster) pausePastLease(ctx context.Context) string {
	p := uint32(cl.rng.IntN(cl.cfg.partitions))
	live := cl.live()
	x := cl.node(live[0].c.Table().Owner(int(p)))
	if x == nil {
		return fmt.Sprintf("pause: partition %d has no running owner", p)
	}
	x.gate.hold(int64(p), 1)
	if !waitFor(ctx, 10*time.Second, func() bool { return x.gate.waiting.Load() > 0 }) {
		x.gate.open()
		return fmt.Sprintf("pause %s on partition %d: no call reached the gate", x.name, p)
	}
	cl.net.Isolate(x.name)
	start := time.Now()
	var mark ownership.Token
	moved := waitFor(ctx, 30*time.Second, func() bool {
		mark, _ = cl.res.mark(ctx, p)
		if mark.Owner == x.name {
			return false
		}
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return cl.okTokens[mark] > 0
	})
	x.gate.open()
	waitFor(ctx, 10*time.Second, func() bool { return x.gate.waiting.Load() == 0 })
	if !moved {
		return fmt.Sprintf("pause %s on partition %d: no other owner wrote within 30 s", x.name, p)
	}
	return fmt.Sprintf("%s paused with a write to partition %d and isolated; %v wrote after %v; write released",
		x.name, p, mark, time.Since(start).Round(time.Millisecond))
}

// finalReads reads every partition once the cluster has settled: the
// last word of the history.
func (cl *cluster) finalReads(ctx context.Context) {
	r := cl.router(cl.cfg.seed + 1000)
	for p := range uint32(cl.cfg.partitions) {
		for attempt := 0; attempt < 5; attempt++ {
			if op := cl.call(ctx, r, cl.cfg.clients, cl.keys[p], false, ""); op.err == nil {
				break
			}
		}
	}
}

// check runs every check on the run's records and returns the violations
// and the number of operations at the resource.
func (cl *cluster) check(ctx context.Context, fencing bool) ([]string, int) {
	cl.mu.Lock()
	viol := append([]string(nil), cl.viol...)
	ops := append([]clientOp(nil), cl.ops...)
	grants := map[ownership.Token]int{}
	for k, v := range cl.grants {
		grants[k] = v
	}
	cl.mu.Unlock()
	recs := cl.hist.Records()

	// Linearizability against the fenced register, per partition. The
	// visualization of a real failure must outlive the test; the control's
	// is expected and goes to the test's directory.
	dir := os.TempDir()
	if !fencing {
		dir = cl.t.TempDir()
	}
	res, err := Check(recs, 30*time.Second, dir)
	if err != nil {
		viol = append(viol, fmt.Sprintf("check: %v", err))
	}
	for _, p := range res.Illegal {
		viol = append(viol, fmt.Sprintf("linearizability: partition %d is not a fenced register (porcupine)", p))
	}
	for _, p := range res.Undecided {
		viol = append(viol, fmt.Sprintf("linearizability: porcupine timed out on partition %d", p))
	}
	if res.Visualization != "" {
		cl.t.Logf("porcupine visualization: %s", res.Visualization)
	}
	// S1 at the resource itself.
	s1, err := cl.res.s1(ctx)
	if err != nil {
		viol = append(viol, fmt.Sprintf("S1 check: %v", err))
	}
	viol = append(viol, s1...)
	viol = append(viol, checkS2(recs)...)
	// S3: no two grants share a token.
	for tok, n := range grants {
		if n > 1 {
			viol = append(viol, fmt.Sprintf("S3: %v granted %d times", tok, n))
		}
	}
	if cl.auth != nil {
		viol = append(viol, checkS4(cl.auth.claims())...)
	}
	viol = append(viol, cl.checkAcked(ops, recs)...)
	return viol, len(recs)
}

// checkS2: an owner fences before it reads or writes: every answered read
// or write under a token started after a fence with that token returned.
func checkS2(recs []Record) []string {
	fenced := map[ownership.Token]int64{}
	for _, r := range recs {
		if r.Kind == Fence && r.Out == OK {
			t := r.Token
			t.MAC = [ownership.MACSize]byte{}
			if at, ok := fenced[t]; !ok || r.End < at {
				fenced[t] = r.End
			}
		}
	}
	var out []string
	for _, r := range recs {
		if r.Kind == Fence || r.Out != OK {
			continue
		}
		t := r.Token
		t.MAC = [ownership.MACSize]byte{}
		if at, ok := fenced[t]; !ok || at > r.Start {
			out = append(out, fmt.Sprintf("S2: %s %s under %v before its fence returned", r.Node, r.Kind, r.Token))
		}
	}
	return out
}

// checkAcked: no acknowledged write is lost. Each partition's final read
// returns a value whose write was applied (or may have been) no earlier
// than the last acknowledged write to it started.
func (cl *cluster) checkAcked(ops []clientOp, recs []Record) []string {
	part := map[string]uint32{}
	for p, k := range cl.keys {
		part[k] = p
	}
	type acked struct {
		op  clientOp
		has bool
	}
	last := map[uint32]acked{}
	final := map[uint32]clientOp{}
	finalClient := cl.cfg.clients
	for _, op := range ops {
		p := part[op.key]
		switch {
		case op.client == finalClient && op.err == nil:
			final[p] = op
		case op.write && op.err == nil:
			if a := last[p]; !a.has || op.end > a.op.end {
				last[p] = acked{op: op, has: true}
			}
		}
	}
	okWrite := map[string]Record{} // value -> its applied write
	unknown := map[string]bool{}
	for _, r := range recs {
		if r.Kind != Write {
			continue
		}
		switch r.Out {
		case OK:
			okWrite[r.Value] = r
		case Unknown:
			unknown[r.Value] = true
		}
	}
	var out []string
	for p := range uint32(cl.cfg.partitions) {
		f, ok := final[p]
		if !ok {
			out = append(out, fmt.Sprintf("lost: no final read of partition %d succeeded", p))
			continue
		}
		a := last[p]
		if !a.has {
			continue
		}
		v := f.rep.Value
		if v == "" {
			out = append(out, fmt.Sprintf("lost: partition %d reads empty after acknowledged write %s", p, a.op.value))
			continue
		}
		lastRec, ok := okWrite[a.op.value]
		if !ok {
			out = append(out, fmt.Sprintf("lost: acknowledged write %s on partition %d has no applied write at the resource", a.op.value, p))
			continue
		}
		w, applied := okWrite[v]
		switch {
		case unknown[v]:
		case !applied:
			out = append(out, fmt.Sprintf("lost: partition %d reads %q, which no write applied", p, v))
		case w.End < lastRec.Start:
			out = append(out, fmt.Sprintf("lost: partition %d reads %q, written before acknowledged write %s started", p, v, a.op.value))
		}
	}
	return out
}
