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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
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
		r.failFenced(t)
	})
	t.Run("sql", func(t *testing.T) {
		r := runChaos(t, runConfig{name: "sql", nodes: 5, partitions: 16, clients: 4, events: sqlEvents, fencing: true, sql: true, seed: seed})
		r.print("violations")
		r.fail(t)
		r.failFenced(t)
	})
	t.Run("postgres", func(t *testing.T) {
		r := runChaos(t, runConfig{name: "postgres", nodes: 5, partitions: 16, clients: 4, events: sqlEvents, fencing: true, sql: true, postgres: true, seed: seed})
		r.print("violations")
		r.fail(t)
		r.failFenced(t)
	})
	t.Run("control", func(t *testing.T) {
		// The memory run's first events (the same seed), fencing off.
		r := runChaos(t, runConfig{name: "control", nodes: 5, partitions: 32, clients: 6, events: 2, fencing: false, seed: seed})
		r.print("control_violations")
		for i, v := range r.violations {
			if i == 5 {
				break
			}
			t.Logf("control violation (expected): %s", v)
		}
		// The deliberate stale write must be caught by each check on its
		// own, so a broken check can't hide behind another.
		w := r.staleWrite
		if w == nil {
			t.Fatal("the control's deliberate stale write (event 0) was never made")
		}
		if w.Out != OK {
			t.Fatalf("the control's stale write under %v was not applied (%v): is fencing off?", w.Token, w.Out)
		}
		if !slices.Contains(r.illegal, w.Token.Partition) {
			t.Errorf("porcupine did not find partition %d, where the stale write under %v was applied, not linearizable (illegal partitions: %v)",
				w.Token.Partition, w.Token, r.illegal)
		}
		if !slices.ContainsFunc(r.s1, func(v s1Violation) bool { return v.tok.Same(w.Token) }) {
			t.Errorf("the S1 check at the resource did not flag the stale write under %v (it flagged %d writes: %v)",
				w.Token, len(r.s1), s1Strings(r.s1))
		}
	})
	t.Run("sigstop", func(t *testing.T) {
		r := runSIGSTOP(t, seed)
		r.print("violations")
		r.fail(t)
	})
	t.Run("pressure", func(t *testing.T) {
		r := runPressure(t, seed)
		r.print("violations")
		r.fail(t)
	})
	t.Run("throttled", func(t *testing.T) {
		r := runThrottled(t, seed)
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
	violations []string // every check's findings
	illegal    []uint32 // porcupine's: the partitions not linearizable
	s1         []s1Violation
	// staleWrite is event 0's deliberate stale write, as answered by the
	// resource (nil if it was never made).
	staleWrite *Record
}

func (r result) print(violationsName string) {
	fmt.Printf("run %s:\n", r.name)
	fmt.Printf("figure: chaos.nemesis_events %d\n", r.events)
	fmt.Printf("figure: chaos.operations %d\n", r.operations)
	fmt.Printf("figure: chaos.stale_rejected %d\n", r.stale)
	fmt.Printf("figure: chaos.%s %d\n", violationsName, len(r.violations))
}

// failFenced fails a fenced run whose deliberate stale write was not
// rejected as stale.
func (r result) failFenced(t *testing.T) {
	t.Helper()
	switch {
	case r.staleWrite == nil:
		t.Error("event 0's deliberate stale write was never made")
	case r.staleWrite.Out != Stale:
		t.Errorf("event 0's stale write under %v was answered %v, not rejected as stale", r.staleWrite.Token, r.staleWrite.Out)
	}
	if r.stale == 0 {
		t.Error("no write was rejected as stale")
	}
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
		d, fcfg := sqlfence.SQLite(), sqlfence.Config{}
		var db *sql.DB
		var err error
		if cfg.postgres {
			// A schema of the run's own, dropped when it ends; the
			// partitions' writes run side by side (Concurrent).
			d, fcfg = sqlfence.Postgres(), sqlfence.Config{Concurrent: true}
			if db, err = sql.Open("pgx", testdb.PostgresSchemaDSN(t)); err == nil {
				db.SetMaxOpenConns(8)
			}
		} else {
			db, err = openSQL(filepath.Join(dir, "chaos.db"))
		}
		if err != nil {
			t.Fatal(err)
		}
		sqlDB = db
		r, err := newSQLResourceOn(ctx, db, d, fcfg, true, cl.hist, cl.onFence)
		if err != nil {
			t.Fatal(err)
		}
		cl.auth = &recAuthority{a: r.f.Authority(), hist: cl.hist, sink: cl.onClaim}
		return r
	})
	if sqlDB != nil {
		t.Cleanup(func() {
			cl.res.(*sqlResource).close()
			_ = sqlDB.Close()
		})
	}
	for i := range cfg.nodes {
		cl.start(ctx, fmt.Sprintf("n%d", i), "", 0)
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
	var staleWrite *Record
	kinds := schedule(cl.rng, cfg.events)
	var episodes [][]scriptStep
	if cfg.script != "" {
		var err error
		if episodes, err = parseScript(cfg.script); err != nil {
			t.Fatal(err)
		}
		kinds = make([]string, len(episodes))
	}
	for i, kind := range kinds {
		var desc string
		switch {
		case episodes != nil:
			desc = cl.runEpisode(ctx, episodes[i])
		case i == 0:
			desc, staleWrite = cl.pausePastLease(ctx)
		default:
			desc = cl.nemesis(ctx, kind)
		}
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
	res := result{name: cfg.name, events: events, stale: cl.stale.Load(), staleWrite: staleWrite}
	cl.check(ctx, cfg.fencing, &res)
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
		desc, _ := cl.pausePastLease(ctx)
		return desc
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
		// A crash restarts under the same name on the same service address
		// and gossip port; restart-new-addr on new ones, which memberlist
		// refuses ("conflicting address") until the old address is dead
		// for DeadNodeReclaimTime.
		n := cl.pick()
		d := time.Duration(500+cl.rng.IntN(2500)) * time.Millisecond
		addr, gossip := n.addr, n.gossip
		if kind == "restart-new-addr" {
			addr, gossip = "", 0
		}
		n.crash()
		hold(ctx, d)
		m := cl.start(ctx, n.name, addr, gossip)
		where := "on its old addresses"
		switch {
		case kind == "restart-new-addr":
			where = "on new addresses"
		case m.addr != n.addr || m.gossip != n.gossip:
			where = "on new addresses (an old one was taken)"
		}
		return fmt.Sprintf("%s crashed for %v, restarted %s (service %s, gossip port %d, incarnation %016x)",
			n.name, d, where, m.addr, m.gossip, m.c.Self().Incarnation)
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

// staleAttempts bounds the tries at the deterministic stale write.
const staleAttempts = 3

// pausePastLease is the deterministic stale write: the owner of a
// partition holds a write at its gate (token attached, not yet sent), is
// cut off until another node has fenced the partition and written under
// its own token, then the held write is sent. A fenced resource must
// reject it; an unfenced one applies it over the newer write. On a loaded
// machine a try can come to nothing (the partition moves before a write
// reaches the gate, or the held write's answer is lost), so it tries up to
// staleAttempts partitions, healing in between. It returns the held
// write's record, or nil when no try made one.
func (cl *cluster) pausePastLease(ctx context.Context) (string, *Record) {
	var tries []string
	for attempt := range staleAttempts {
		if attempt > 0 {
			cl.heal()
			if _, err := cl.waitSettled(ctx, 30*time.Second); err != nil {
				tries = append(tries, fmt.Sprintf("not settled: %v", err))
			}
		}
		desc, rec := cl.staleWrite(ctx)
		if rec != nil {
			return strings.Join(append(tries, desc), "; "), rec
		}
		tries = append(tries, desc)
	}
	return "no stale write: " + strings.Join(tries, "; "), nil
}

// staleWrite is one try of pausePastLease.
func (cl *cluster) staleWrite(ctx context.Context) (string, *Record) {
	p := uint32(cl.rng.IntN(cl.cfg.partitions))
	var x *node
	for _, n := range cl.live() {
		if _, err := n.c.LeaseOfPartition(p); err == nil {
			x = n
			break
		}
	}
	if x == nil {
		return fmt.Sprintf("pause: partition %d has no lease holder", p), nil
	}
	x.gate.hold(int64(p), 1, true)
	if !waitFor(ctx, 15*time.Second, func() bool { return x.gate.waiting.Load() > 0 }) {
		x.gate.open()
		return fmt.Sprintf("pause %s on partition %d: no write reached the gate", x.name, p), nil
	}
	cl.net.Isolate(x.name)
	start := time.Now()
	// Wait for another node to write under a higher token (with fencing
	// on, the mark: it fenced first).
	held := x.gate.lastHeld()
	var mark ownership.Token
	moved := waitFor(ctx, 30*time.Second, func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for t, n := range cl.okTokens {
			if n > 0 && t.Partition == p && t.Owner != x.name && held.Less(t) {
				mark = t
				return true
			}
		}
		return false
	})
	opened := Now()
	x.gate.open()
	// The held write, answered: the only held call on p at x sent since.
	var rec *Record
	waitFor(ctx, 15*time.Second, func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for i := range cl.held {
			if r := cl.held[i]; r.Token.Partition == p && r.Node == x.name && r.Start >= opened {
				rec = &r
				return true
			}
		}
		return false
	})
	switch {
	case !moved:
		return fmt.Sprintf("pause %s on partition %d: no other owner wrote within 30 s", x.name, p), nil
	case rec == nil:
		return fmt.Sprintf("pause %s on partition %d: the held write never returned", x.name, p), nil
	case rec.Out == Unknown:
		return fmt.Sprintf("pause %s on partition %d: the held write's outcome is unknown", x.name, p), nil
	}
	return fmt.Sprintf("%s paused with a write to partition %d and isolated; %v wrote after %v; held write under %v sent: %v",
		x.name, p, mark, time.Since(start).Round(time.Millisecond), rec.Token, rec.Out), rec
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

// check runs every check on the run's records and fills in res's
// violations, porcupine's illegal partitions, the S1 violations and the
// number of operations at the resource.
func (cl *cluster) check(ctx context.Context, fencing bool, res *result) {
	cl.mu.Lock()
	viol := append([]string(nil), cl.viol...)
	ops := append([]clientOp(nil), cl.ops...)
	grants := map[ownership.Token]int{}
	for k, v := range cl.grants {
		grants[k] = v
	}
	cl.mu.Unlock()
	recs := cl.hist.Records()
	res.operations = len(recs)

	// Linearizability against the fenced register, per partition. The
	// visualization of a real failure must outlive the test; the control's
	// is expected and goes to the test's directory.
	dir := os.TempDir()
	if !fencing {
		dir = cl.t.TempDir()
	}
	lin, err := Check(recs, 30*time.Second, dir)
	if err != nil {
		viol = append(viol, fmt.Sprintf("check: %v", err))
	}
	res.illegal = lin.Illegal
	for _, p := range lin.Illegal {
		viol = append(viol, fmt.Sprintf("linearizability: partition %d is not a fenced register (porcupine)", p))
	}
	for _, p := range lin.Undecided {
		viol = append(viol, fmt.Sprintf("linearizability: porcupine timed out on partition %d", p))
	}
	if lin.Visualization != "" {
		cl.t.Logf("porcupine visualization: %s", lin.Visualization)
	}
	// S1 at the resource itself.
	s1, err := cl.res.s1(ctx)
	if err != nil {
		viol = append(viol, fmt.Sprintf("S1 check: %v", err))
	}
	res.s1 = s1
	viol = append(viol, s1Strings(s1)...)
	viol = append(viol, checkS2(recs)...)
	viol = append(viol, checkS3(grants)...)
	if cl.auth != nil {
		viol = append(viol, checkS4(cl.auth.claims())...)
	}
	viol = append(viol, cl.checkAcked(ops, recs)...)
	// A fenced node stops serving: every lease rejected as stale has
	// ended (ReportStale is asynchronous: allow it to land).
	var live []string
	waitFor(ctx, 10*time.Second, func() bool { live = cl.checkFencedEnded(); return len(live) == 0 })
	res.violations = append(viol, live...)
}

// checkS3: no two grants share a token (grants counts the Acquire calls
// per token).
func checkS3(grants map[ownership.Token]int) []string {
	var out []string
	for tok, n := range grants {
		if n > 1 {
			out = append(out, fmt.Sprintf("S3: %v granted %d times", tok, n))
		}
	}
	return out
}

// checkS2: an owner fences before it reads or writes: every answered read
// or write under a token started after a fence with that token returned
// (the owner's own Fence call: a claim that fenced doesn't count).
func checkS2(recs []Record) []string {
	fenced := map[ownership.Token]int64{}
	for _, r := range recs {
		if r.Kind == Fence && r.Out == OK && r.Value != claimFence {
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
