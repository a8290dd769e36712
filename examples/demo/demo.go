//go:build unix

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/anishathalye/porcupine"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/internal/pressure"
	"github.com/tenure-go/tenure/internal/sigstop"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
)

type config struct {
	nodes, partitions, writers, keys   int
	phase, pause, cut, timeout         time.Duration
	dir, dsn, report                   string
	keep, strictLeave, netns, pressure bool
}

// demo is the cluster of child processes and the workload's counters.
type demo struct {
	cfg   config
	self  string // this executable, started as each node
	dir   string
	runID string // prefixes this run's keys, so a reused database is fine
	t0    time.Time

	mu    sync.Mutex
	live  map[string]*proc // running nodes, paused ones included
	gone  []*proc          // nodes that exited, for their last counters
	phase string
	story story // the faults and settling windows, for the report

	ops, acked, failed, staleSeen, reads, staleReads atomic.Int64
	late                                             atomic.Int64 // reads and final values of late unknown writes (see unknown)
	client                                           clientPath

	net *nsNet // with -netns: the nodes' network namespaces; nil on loopback
}

// writer is one client: it alone writes its keys, each with increasing
// values, so the last acknowledged value of a key is a floor for what a
// read must return at the end.
type writer struct {
	id          int
	next, acked []uint64 // by key index: last value sent, last value acknowledged
	history     []op     // every call, for the linearizability check
}

func (d *demo) key(w, i int) string { return fmt.Sprintf("%s/w%d/k%d", d.runID, w, i) }

// now is the time since the run began, for the history.
func (d *demo) now() int64 { return int64(time.Since(d.t0)) }

// record adds a call to w's history: a Put (acknowledged or not) or a Get
// that returned.
func (d *demo) record(w *writer, i int, put bool, value uint64, start int64, acked bool) {
	end := d.now()
	if !acked {
		end = unknownEnd
	}
	w.history = append(w.history, op{key: w.id*d.cfg.keys + i, put: put, value: value, start: start, end: end})
}

func run(ctx context.Context, cfg config) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	d := &demo{cfg: cfg, self: self, dir: cfg.dir, live: map[string]*proc{}, runID: strconv.FormatInt(time.Now().UnixNano(), 36), t0: time.Now()}
	d.story.t0 = d.t0
	if d.dir == "" {
		if d.dir, err = os.MkdirTemp("", "tenure-demo-"); err != nil {
			return false, err
		}
		if !cfg.keep {
			defer os.RemoveAll(d.dir)
		}
	}
	if cfg.netns {
		names := make([]string, cfg.nodes)
		for i := range names {
			names[i] = nodeName(i)
		}
		if d.net, err = openNet(names, cfg.dsn); err != nil {
			return false, err
		}
		defer func() { // after the nodes are killed
			if err := d.net.close(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}()
		fmt.Printf("network namespaces: each node in its own, PostgreSQL through a relay at %s; cuts are nftables rules\n", d.net.relay.Addr())
	}
	defer d.killAll()

	start := time.Now()
	for i := range cfg.nodes {
		if _, err := d.start(ctx, nodeName(i)); err != nil {
			return false, err
		}
	}
	if _, err := d.settle(ctx); err != nil {
		return false, err
	}
	first := d.get("node-0")
	fmt.Printf("%d nodes (child processes) own %d partitions after %.1fs\n", cfg.nodes, cfg.partitions, time.Since(start).Seconds())
	fmt.Printf("status page: http://%s/  (every node has one; JSON: ?format=json, counters: /kv/stats)\n", first.status)
	if cfg.dsn == "" {
		fmt.Printf("data and node logs: %s\n", d.dir)
	}

	// CPU pressure (-pressure): the phases below run on a busy machine,
	// marked in the report from here to the end of the workload.
	stopPressure, err := d.startPressure()
	if err != nil {
		return false, err
	}
	defer stopPressure()

	// The workload.
	wctx, stopWriters := context.WithCancel(ctx)
	writers := make([]*writer, cfg.writers)
	var wg sync.WaitGroup
	defer func() {
		stopWriters()
		wg.Wait()
	}()
	for i := range writers {
		w := &writer{id: i, next: make([]uint64, cfg.keys), acked: make([]uint64, cfg.keys)}
		writers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.write(wctx, w, rand.New(rand.NewPCG(uint64(i), 42)))
		}()
	}
	stopProgress := d.progress(start)
	defer stopProgress()
	stale := d.sampleStale()
	defer stale.stop()

	// The faults, in turn.
	d.setPhase("steady")
	d.wait(ctx, cfg.phase)

	victim := d.get("node-3")
	d.setPhase("pause node-3 (SIGSTOP)")
	takeover, heldRefused, err := d.pause(ctx, victim)
	if err != nil {
		return false, err
	}
	d.setPhase("node-3 resumed (SIGCONT)")
	resumed, err := d.settle(ctx)
	if err != nil {
		return false, err
	}
	d.story.settled("node-3 back after its pause", resumed, false)
	d.wait(ctx, cfg.phase)

	d.setPhase("crash node-1 (SIGKILL)")
	crashed := d.remove("node-1")
	d.story.mark("crash node-1 (SIGKILL)")
	crashed.kill()
	failover, err := d.settle(ctx)
	if err != nil {
		return false, err
	}
	d.story.settled("crashed node-1's partitions failed over", failover, true)
	d.wait(ctx, cfg.phase)

	d.setPhase("restart node-1")
	t0 := time.Now()
	d.story.mark("restart node-1")
	if _, err := d.start(ctx, "node-1"); err != nil {
		return false, err
	}
	if _, err := d.settle(ctx); err != nil {
		return false, err
	}
	rejoin := time.Since(t0)
	d.story.settled("node-1 restarted and rejoined", rejoin, false)
	d.wait(ctx, cfg.phase)

	d.setPhase("network cut {0,1} | {2,3,4}")
	small, large := d.split(2)
	if err := d.cut(small, large); err != nil {
		return false, err
	}
	t0 = time.Now()
	d.story.mark("network cut {0,1} | {2,3,4}")
	if _, err := d.settleAmong(ctx, large); err != nil {
		return false, err
	}
	cutFailover := time.Since(t0)
	var cutErr error // with -netns: the cut seen from inside the namespaces
	if d.net != nil {
		cutErr = d.net.verifyCut(small, large)
	}
	d.story.settled("the majority side {2,3,4} took over", cutFailover, true)
	d.wait(ctx, cfg.cut-cutFailover)
	d.setPhase("network healed")
	if err := d.cut(nil, d.list()); err != nil {
		return false, err
	}
	d.story.mark("network healed")
	healed, err := d.settle(ctx)
	if err != nil {
		return false, err
	}
	d.story.settled("the cut healed, the tables merged", healed, false)
	d.wait(ctx, cfg.phase)
	if d.net != nil {
		if err := d.lossy(ctx); err != nil {
			return false, err
		}
	}

	d.setPhase("graceful leave of node-2")
	leaver := d.remove("node-2")
	t0 = time.Now()
	d.story.mark("graceful leave of node-2")
	d.client.window(func(c *clientPath) { c.leaveAt, c.leftAt = t0, t0.Add(time.Hour) })
	if err := leaver.stop(ctx); err != nil {
		return false, err
	}
	if _, err := d.settle(ctx); err != nil {
		return false, err
	}
	d.client.window(func(c *clientPath) { c.leftAt = time.Now() })
	handoff := time.Since(t0)
	d.story.settled("node-2 left, handing off", handoff, false)
	d.wait(ctx, cfg.phase)

	d.setPhase("checking")
	stopWriters()
	wg.Wait()
	stopProgress()
	stopPressure()

	lost, reads, err := d.readBack(ctx, writers)
	if err != nil {
		return false, err
	}
	rows, staleAccepted, err := d.verifyLog(ctx)
	if err != nil {
		return false, err
	}
	dups, err := d.duplicates(ctx)
	if err != nil {
		return false, err
	}
	var history []op
	for _, w := range writers {
		history = append(history, w.history...)
	}
	visual := filepath.Join(os.TempDir(), "tenure-demo-"+d.runID+"-linearizability.html")
	verdict, err := checkHistory(history, visual)
	if err != nil {
		return false, err
	}
	linearizable := verdict == porcupine.Ok
	var staleRejected uint64
	for _, p := range append(d.list(), d.goneList()...) {
		p.scrape()
		staleRejected += p.last.StaleRejected
	}

	fmt.Printf("\nreport: %d operations: %d acknowledged writes, %d failed or timed out (the client retries with a new value), %d reads (%d stale)\n",
		d.ops.Load(), d.acked.Load(), d.failed.Load(), d.reads.Load(), d.staleReads.Load())
	fmt.Printf("        %d stale writes rejected by the fence (%d of them answered to a client as stale)\n", staleRejected, d.staleSeen.Load())
	fmt.Printf("        %d keys read back: %d acknowledged writes lost; write log of %d rows: %d stale writes accepted\n", reads, lost, rows, staleAccepted)
	switch verdict {
	case porcupine.Ok:
		fmt.Printf("        history of %d calls: linearizable, key by key (porcupine)\n", len(history))
	case porcupine.Illegal:
		fmt.Printf("        history of %d calls: NOT linearizable; porcupine's visualization: %s\n", len(history), visual)
	default:
		fmt.Printf("        history of %d calls: porcupine ran out of time (undecided); visualization: %s\n", len(history), visual)
	}
	fmt.Printf("        node-3's partitions taken over %.2fs into its pause; the write it held across the pause was %s\n",
		takeover.Seconds(), map[bool]string{true: "refused by the fence", false: "NOT refused by the fence"}[heldRefused])
	if rows < int(d.acked.Load()) {
		fmt.Printf("        the write log holds fewer records (%d) than acknowledged writes (%d)\n", rows, d.acked.Load())
	}
	fmt.Printf("        settled after: pause %.2fs, crash %.2fs, restart %.2fs, cut (majority side) %.2fs, heal %.2fs, leave %.2fs\n",
		resumed.Seconds(), failover.Seconds(), rejoin.Seconds(), cutFailover.Seconds(), healed.Seconds(), handoff.Seconds())
	client := d.client.figures()
	client.print(takeover, dups, func(k string) uint32 { return ring.PartitionString(k, cfg.partitions) })
	fmt.Printf("figure: demo.operations %d\n", d.ops.Load())
	fmt.Printf("figure: demo.acked_writes %d\n", d.acked.Load())
	fmt.Printf("figure: demo.stale_rejected %d\n", staleRejected)
	fmt.Printf("figure: demo.lost_writes %d\n", lost)
	fmt.Printf("figure: demo.stale_accepted %d\n", staleAccepted)
	fmt.Printf("figure: demo.stale_reads %d\n", d.staleReads.Load())
	fmt.Printf("figure: demo.late_unknown_writes %d\n", d.late.Load())
	fmt.Printf("figure: demo.linearizable %v\n", linearizable)
	fmt.Printf("figure: demo.paused_write_refused %v\n", heldRefused)
	fmt.Printf("figure: demo.pause_takeover_seconds %.3f\n", takeover.Seconds())
	fmt.Printf("figure: demo.failover_seconds %.3f\n", failover.Seconds())
	fmt.Printf("figure: demo.pause_recovery_seconds %.3f\n", resumed.Seconds())
	fmt.Printf("figure: demo.cut_failover_seconds %.3f\n", cutFailover.Seconds())
	fmt.Printf("figure: demo.heal_seconds %.3f\n", healed.Seconds())
	fmt.Printf("figure: demo.handoff_seconds %.3f\n", handoff.Seconds())
	fmt.Printf("figure: demo.total_seconds %.1f\n", time.Since(start).Seconds())
	stale.stop()
	checks := append([]check{
		{Name: "the paused node's held write refused by the fence", Value: fmt.Sprint(heldRefused), OK: heldRefused},
		{Name: "acknowledged writes lost", Value: fmt.Sprint(lost), OK: lost == 0},
		{Name: "stale writes accepted (write log)", Value: fmt.Sprint(staleAccepted), OK: staleAccepted == 0},
		{Name: "stale reads", Value: fmt.Sprint(d.staleReads.Load()), OK: d.staleReads.Load() == 0},
		{Name: "writes whose call failed, applied after a later acknowledged write (linearizable; reads and final values)", Value: fmt.Sprint(d.late.Load()), OK: d.late.Load() == 0, Shown: true},
		{Name: "history linearizable, key by key (porcupine)", Value: fmt.Sprintf("%v (%d calls)", verdict, len(history)), OK: linearizable},
		{Name: "write log holds every acknowledged write", Value: fmt.Sprintf("%d rows, %d acknowledged", rows, d.acked.Load()), OK: d.acked.Load() > 0 && rows >= int(d.acked.Load())},
		{Name: "stale writes rejected by the fences", Value: fmt.Sprint(staleRejected), OK: true},
	}, client.checks(dups, d.cfg.strictLeave)...)
	if d.net != nil {
		verdict := "yes"
		if cutErr != nil {
			verdict = cutErr.Error()
		}
		checks = append(checks, check{Name: "the cut dropped the minority's database and gRPC traffic (-netns)", Value: verdict, OK: cutErr == nil})
	}
	report, err := d.writeReport(history, stale.times(), checks)
	if err != nil {
		return false, fmt.Errorf("report: %w", err)
	}
	fmt.Printf("report as a picture: %s\n", report)
	return allPassed(checks), nil
}

// allPassed reports whether every check passed: the run's verdict.
func allPassed(checks []check) bool {
	for _, c := range checks {
		if !c.OK && !c.Shown {
			return false
		}
	}
	return true
}

// write runs one writer until ctx ends: a Put of the next value of a random
// key of its own, through a random node (which routes it to the owner), and
// now and then a Get of a key it has written, which must return at least
// the last value acknowledged before the Get began.
//
// Most writers give a call one second, and after a timeout they try other
// entry nodes for two seconds (a client can't tell whether the node it
// called or the owner behind it is stuck), so a paused node costs them
// little.
// Writers 0 and 1 wait longer than a pause and avoid nothing, so a call a
// paused owner had taken is still wanted when it resumes: its write then
// meets the fence.
func (d *demo) write(ctx context.Context, w *writer, r *rand.Rand) {
	timeout, patient := time.Second, w.id < 2
	if patient {
		timeout = d.cfg.timeout
	}
	avoid := map[string]time.Time{} // node -> until when
	for ctx.Err() == nil {
		nodes := slices.DeleteFunc(d.list(), func(p *proc) bool { return time.Now().Before(avoid[p.name]) })
		if len(nodes) == 0 {
			d.wait(ctx, 10*time.Millisecond)
			continue
		}
		p := nodes[r.IntN(len(nodes))]
		i := r.IntN(d.cfg.keys)
		if w.acked[i] > 0 && r.IntN(4) == 0 {
			d.readOnce(ctx, w, p, i, timeout)
			continue
		}
		w.next[i]++
		v := w.next[i]
		start, began := d.now(), time.Now()
		cctx, cancel := context.WithTimeout(ctx, timeout)
		// A request id per write: the cluster may retry it, and applies it once.
		cctx, _ = transport.WithRequestID(cctx, fmt.Sprintf("%s/w%d/k%d/%d", d.runID, w.id, i, v))
		_, err := p.kv.Put(cctx, &kvpb.PutRequest{Key: d.key(w.id, i), Value: []byte(strconv.FormatUint(v, 10))})
		cancel()
		if ctx.Err() == nil { // not cut short by the end of the run
			d.client.add(p.name, d.key(w.id, i), began, err)
		}
		d.ops.Add(1)
		d.record(w, i, true, v, start, err == nil)
		if err == nil {
			w.acked[i] = v
			d.acked.Add(1)
			continue
		}
		d.failed.Add(1)
		if _, ok := transport.StaleFromStatus(err); ok {
			d.staleSeen.Add(1)
		}
		if !patient && status.Code(err) == codes.DeadlineExceeded {
			avoid[p.name] = time.Now().Add(2 * time.Second)
		}
		d.wait(ctx, 5*time.Millisecond) // no owner ready, or the node is gone: back off
	}
}

// readOnce reads key i of w and checks it against what w knows.
func (d *demo) readOnce(ctx context.Context, w *writer, p *proc, i int, timeout time.Duration) {
	floor, ceiling := w.acked[i], w.next[i]
	start := d.now()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := p.kv.Get(cctx, &kvpb.GetRequest{Key: d.key(w.id, i)})
	cancel()
	d.ops.Add(1)
	if err != nil {
		d.failed.Add(1)
		d.wait(ctx, 5*time.Millisecond)
		return
	}
	d.reads.Add(1)
	got, perr := strconv.ParseUint(string(resp.GetValue()), 10, 64)
	d.record(w, i, false, got, start, true)
	switch {
	case resp.GetFound() && perr == nil && got < floor && d.unknown(w, i, got):
		d.late.Add(1)
		fmt.Printf("\nLATE WRITE: %s returned %d, a write whose call failed, applied after %d was acknowledged\n", d.key(w.id, i), got, floor)
	case !resp.GetFound() || perr != nil || got < floor || got > ceiling:
		d.staleReads.Add(1)
		fmt.Printf("\nSTALE READ: %s returned %q (found %v), acknowledged %d, last sent %d\n",
			d.key(w.id, i), resp.GetValue(), resp.GetFound(), floor, ceiling)
	}
}

// unknown reports whether w sent value v to key i in a call that failed
// (a timeout, say): the write may have been applied, at any time, even
// after a later write of w's was acknowledged. Linearizability allows it
// (the call never ended), and porcupine's check accepts it; so do the
// stale-read and lost-write checks, which count it apart (late). On a real
// network (-netns) it happens, likely so: a request held up by a cut or by
// loss reaches the owner after the client gave up (gRPC sends its deadline
// as a relative timeout, which starts again where the request arrives)
// and is applied.
func (d *demo) unknown(w *writer, i int, v uint64) bool {
	key := w.id*d.cfg.keys + i
	return slices.ContainsFunc(w.history, func(o op) bool { return o.put && o.key == key && o.value == v && o.end == unknownEnd })
}

// logOf returns the write log's records of key in commit order, a line
// each, to show who applied a late write and when.
func (d *demo) logOf(ctx context.Context, key string) string {
	db, err := kvnode.OpenDB(d.sqlitePath(), d.cfg.dsn)
	if err != nil {
		return fmt.Sprintf("  (%v)\n", err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT id, owner, epoch, value, request_id FROM kv_log WHERE key = $1 ORDER BY id`, key)
	if err != nil {
		return fmt.Sprintf("  (%v)\n", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, epoch int64
		var owner, value string
		var req sql.NullString
		if err := rows.Scan(&id, &owner, &epoch, &value, &req); err != nil {
			return b.String() + fmt.Sprintf("  (%v)\n", err)
		}
		fmt.Fprintf(&b, "  log %d: value %s by %s at epoch %d, request %s\n", id, value, owner, epoch, req.String)
	}
	return b.String()
}

// readBack reads every written key through the cluster and counts the keys
// whose value is older than their last acknowledged write: lost writes.
func (d *demo) readBack(ctx context.Context, writers []*writer) (lost, reads int, err error) {
	nodes := d.list()
	for _, w := range writers {
		for i, acked := range w.acked {
			if w.next[i] == 0 {
				continue
			}
			start := d.now()
			got, err := d.read(ctx, nodes[(w.id+i)%len(nodes)], d.key(w.id, i))
			if err != nil {
				return lost, reads, err
			}
			d.record(w, i, false, got, start, true)
			reads++
			switch {
			case got < acked && d.unknown(w, i, got):
				d.late.Add(1)
				fmt.Printf("LATE WRITE: %s holds %d, a write whose call failed, applied after %d was acknowledged; its write log:\n%s",
					d.key(w.id, i), got, acked, d.logOf(ctx, d.key(w.id, i)))
			case got < acked || got > w.next[i]:
				lost++
				fmt.Printf("LOST: %s holds %d, last acknowledged %d, last sent %d\n", d.key(w.id, i), got, acked, w.next[i])
			}
		}
	}
	return lost, reads, nil
}

// read gets one key, retrying while its partition has no owner ready.
func (d *demo) read(ctx context.Context, p *proc, key string) (uint64, error) {
	var last error
	for range 50 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := p.kv.Get(cctx, &kvpb.GetRequest{Key: key})
		cancel()
		if err == nil {
			if !resp.GetFound() {
				return 0, nil
			}
			return strconv.ParseUint(string(resp.GetValue()), 10, 64)
		}
		last = err
		d.wait(ctx, 100*time.Millisecond)
	}
	return 0, fmt.Errorf("read %s: %w", key, last)
}

// verifyLog checks the nodes' write log (kvnode.VerifyLog): every write
// committed under the token that was its partition's mark, and tokens
// never went down in commit order.
func (d *demo) verifyLog(ctx context.Context) (rows, violations int, err error) {
	db, err := kvnode.OpenDB(d.sqlitePath(), d.cfg.dsn)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	return kvnode.VerifyLog(ctx, db, d.runID+"/")
}

func (d *demo) sqlitePath() string { return filepath.Join(d.dir, "kvstore.db") }

// nodeName is the name of the i-th node.
func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// start launches a node that joins the live ones.
func (d *demo) start(ctx context.Context, name string) (*proc, error) {
	host, dsn := "127.0.0.1", d.cfg.dsn
	if d.net != nil {
		host, dsn = d.net.host(name), d.net.dsn
	}
	args := []string{
		"-gossip", host + ":0", "-grpc", host + ":0", "-status", host + ":0",
		"-preset", "local", "-partitions", strconv.Itoa(d.cfg.partitions), "-fault-control",
	}
	if dsn != "" {
		args = append(args, "-dsn", dsn)
	} else {
		args = append(args, "-data", d.sqlitePath())
	}
	if seeds := gossipAddrs(d.list()); len(seeds) > 0 {
		args = append(args, "-seeds", strings.Join(seeds, ","))
	}
	args = append([]string{nodeCommand, "-name", name}, args...)
	cmd := exec.Command(d.self, args...)
	if d.net != nil {
		cmd = d.net.command(name, d.self, args...)
	}
	p, err := spawn(ctx, cmd, name, filepath.Join(d.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.live[name] = p
	d.mu.Unlock()
	return p, nil
}

func (d *demo) get(name string) *proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[name]
}

// remove takes a node out of the workload before it is stopped, keeping its
// last counters.
func (d *demo) remove(name string) *proc {
	d.mu.Lock()
	p := d.live[name]
	delete(d.live, name)
	d.mu.Unlock()
	p.scrape()
	d.mu.Lock()
	d.gone = append(d.gone, p)
	d.mu.Unlock()
	return p
}

// list returns the live nodes sorted by name.
func (d *demo) list() []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*proc, 0, len(d.live))
	for _, p := range d.live {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *proc) int { return strings.Compare(a.name, b.name) })
	return out
}

func (d *demo) goneList() []*proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.gone)
}

func (d *demo) killAll() {
	for _, p := range d.list() {
		p.kill()
	}
}

// gossipAddrs returns the gossip addresses of ps.
func gossipAddrs(ps []*proc) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.gossip)
	}
	return out
}

// split divides the live nodes into the first n and the rest.
func (d *demo) split(n int) (small, large []*proc) {
	all := d.list()
	return all[:n], all[n:]
}

// cut makes every node of a drop gossip with every node of b and the other
// way round; cut(nil, all) heals. With -netns it cuts the network itself
// instead: gossip, gRPC and, for a, the database.
func (d *demo) cut(a, b []*proc) error {
	if d.net != nil {
		return d.net.cut(a, b)
	}
	for _, p := range a {
		if err := p.cut(gossipAddrs(b)); err != nil {
			return err
		}
	}
	for _, p := range b {
		if err := p.cut(gossipAddrs(a)); err != nil {
			return err
		}
	}
	return nil
}

// lossyPhase names the fault lossy injects.
const lossyPhase = "20% loss at node-4, one-way cut node-0 -> node-3"

// lossy runs the workload for a phase with 20% of node-4's incoming
// packets lost and node-0's packets to node-3 dropped (one way), then
// heals and waits for the cluster to settle (-netns only).
func (d *demo) lossy(ctx context.Context) error {
	d.setPhase(lossyPhase)
	if err := d.net.lossy("node-4", "node-0", "node-3"); err != nil {
		return err
	}
	d.story.mark(lossyPhase)
	d.wait(ctx, d.cfg.phase)
	if err := d.net.cut(nil, nil); err != nil {
		return err
	}
	healed, err := d.settle(ctx)
	if err != nil {
		return err
	}
	d.story.settled("settled after the loss and the one-way cut", healed, false)
	d.wait(ctx, d.cfg.phase)
	return nil
}

// settle waits until every live node sees exactly the live nodes and a
// converged ownership table, and returns how long that took.
func (d *demo) settle(ctx context.Context) (time.Duration, error) {
	return d.settleAmong(ctx, d.list())
}

// settleAmong waits until the given nodes see exactly each other.
func (d *demo) settleAmong(ctx context.Context, nodes []*proc) (time.Duration, error) {
	start := time.Now()
	names := map[string]bool{}
	for _, p := range nodes {
		names[p.name] = true
	}
	err := d.poll(ctx, time.Minute, func() bool {
		for _, p := range nodes {
			if !p.settled(names) {
				return false
			}
		}
		return true
	})
	if err != nil {
		return 0, errors.New("the cluster did not settle within a minute")
	}
	return time.Since(start), nil
}

// wait lets d pass unless ctx ends first.
func (d *demo) wait(ctx context.Context, dur time.Duration) {
	if dur <= 0 {
		return
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (d *demo) setPhase(s string) {
	d.mu.Lock()
	d.phase = s
	d.mu.Unlock()
}

// progress prints a live progress line until the returned func is called.
func (d *demo) progress(start time.Time) (stop func()) {
	tty := false
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		tty = true
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	lastPhase := ""
	line := func(final bool) {
		d.mu.Lock()
		phase := d.phase
		d.mu.Unlock()
		text := fmt.Sprintf("[%5.1fs] %-30s ops %8d  acked %8d  failed %6d  live %d",
			time.Since(start).Seconds(), phase, d.ops.Load(), d.acked.Load(), d.failed.Load(), len(d.list()))
		switch {
		case tty && !final:
			fmt.Printf("\r%s", text)
		case tty:
			fmt.Printf("\r%s\n", text)
		case phase != lastPhase || final:
			fmt.Println(text)
		}
		lastPhase = phase
	}
	go func() {
		defer close(finished)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				line(true)
				return
			case <-tick.C:
				line(false)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
		})
	}
}

// pause shows the fence at work on a paused owner, deterministically:
//
//  1. it finds a key of a partition victim owns (a probe Put through
//     victim answers with the owner) and has victim hold the next write to
//     that partition after the gate, with the lease's token, before the
//     database (fault control: POST /debug/hold);
//  2. it sends that write to victim, waits until it is held, and stops
//     victim with SIGSTOP;
//  3. it keeps victim stopped for at least -pause and until every other
//     node sees its partitions taken over;
//  4. it resumes victim with SIGCONT and releases the held write, which
//     reaches the database under its old token and must be refused.
//
// It returns how long the takeover took and whether victim's fence
// refused the held write.
func (d *demo) pause(ctx context.Context, victim *proc) (takeover time.Duration, refused bool, err error) {
	key, partition, err := d.keyOwnedBy(ctx, victim)
	if err != nil {
		return 0, false, err
	}
	if err := victim.post(fmt.Sprintf("/debug/hold?partition=%d", partition)); err != nil {
		return 0, false, err
	}
	victim.scrape()
	before := victim.last.StaleRejected
	held := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, d.cfg.pause+time.Minute)
		defer cancel()
		_, err := victim.kv.Put(cctx, &kvpb.PutRequest{Key: key, Value: []byte("held")})
		held <- err
	}()
	if err := d.poll(ctx, 10*time.Second, func() bool { return victim.holding(partition) }); err != nil {
		return 0, false, fmt.Errorf("the write to p%d did not reach %s's hold: %w", partition, victim.name, err)
	}

	if err := d.stop(ctx, victim); err != nil {
		return 0, false, err
	}
	start := time.Now()
	d.client.window(func(c *clientPath) { c.paused, c.stopAt, c.contAt = victim.name, start, start.Add(time.Hour) })
	d.story.mark("pause " + victim.name + " (SIGSTOP)")
	others := slices.DeleteFunc(d.list(), func(p *proc) bool { return p == victim })
	err = d.poll(ctx, d.cfg.pause+time.Minute, func() bool {
		if takeover == 0 && allHold(others, victim.name) {
			takeover = time.Since(start)
		}
		return takeover > 0 && time.Since(start) >= d.cfg.pause
	})
	d.story.settledAt(victim.name+"'s partitions taken over", start, start.Add(takeover), true)
	if cerr := victim.signal(syscall.SIGCONT); err == nil {
		err = cerr
	}
	d.client.window(func(c *clientPath) { c.contAt = time.Now() })
	d.story.mark(victim.name + " resumed (SIGCONT)")
	if err != nil {
		return 0, false, fmt.Errorf("the other nodes did not take over %s's partitions: %w", victim.name, err)
	}

	if err := victim.post(fmt.Sprintf("/debug/release?partition=%d", partition)); err != nil {
		return 0, false, err
	}
	<-held // refused, then perhaps retried by the router at the new owner: either way done
	refused = d.poll(ctx, 5*time.Second, func() bool {
		victim.scrape()
		return victim.last.StaleRejected > before
	}) == nil
	return takeover, refused, nil
}

// keyOwnedBy finds a key (of this run, outside the writers' keys) whose
// partition p owns now: a Put through p answers with the owner.
func (d *demo) keyOwnedBy(ctx context.Context, p *proc) (string, uint32, error) {
	for j := range 1000 {
		key := fmt.Sprintf("%s/probe/%d", d.runID, j)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := p.kv.Put(cctx, &kvpb.PutRequest{Key: key, Value: []byte("probe")})
		cancel()
		if err == nil && resp.GetOwner() == p.name {
			return key, resp.GetPartition(), nil
		}
	}
	return "", 0, fmt.Errorf("found no key that %s owns", p.name)
}

// poll checks cond every 20 ms until it holds or timeout passes.
func (d *demo) poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v", timeout)
		case <-tick.C:
		}
	}
	return nil
}

// allHold reports whether every node of ps sees no partition held by name.
func allHold(ps []*proc, name string) bool {
	for _, p := range ps {
		if p.held(name) != 0 {
			return false
		}
	}
	return true
}

// stop sends SIGSTOP to p. With SQLite it makes sure p was not stopped
// inside a write transaction, which would hold the file's write lock and
// so stop every node's writes (and the new owners' fences) with it.
func (d *demo) stop(ctx context.Context, p *proc) error {
	if d.cfg.dsn != "" {
		return p.signal(syscall.SIGSTOP)
	}
	return sigstop.StopUnlocked(ctx, p.cmd.Process.Pid, d.sqlitePath())
}

// busyLoopsPerCore is -pressure's load: two busy loops per core, issue 20's
// busy machine.
const busyLoopsPerCore = 2

// startPressure starts -pressure's busy loops, each ending by itself after
// pressure.MaxDuration at the latest (a default run takes under a minute),
// marks their start in the report and returns the function that
// stops them and marks their end (idempotent); without -pressure it does
// nothing.
func (d *demo) startPressure() (stop func(), err error) {
	if !d.cfg.pressure {
		return func() {}, nil
	}
	load, err := pressure.Busy(busyLoopsPerCore, pressure.MaxDuration)
	if err != nil {
		return nil, fmt.Errorf("-pressure: %w", err)
	}
	d.story.mark(fmt.Sprintf("pressure on: %d busy loops", load.Loops()))
	fmt.Printf("CPU pressure: %d busy loops (%d per core) run beside every phase\n", load.Loops(), busyLoopsPerCore)
	var once sync.Once
	return func() {
		once.Do(func() {
			load.Stop()
			d.story.mark("pressure off")
		})
	}, nil
}
