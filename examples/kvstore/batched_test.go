//go:build unix

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/examples/kvstore/kvpb"
	"github.com/tenure-go/tenure/internal/sigstop"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
	"github.com/tenure-go/tenure/transport"
)

// batchedWriters is how many clients write in figuresBatched: three writes
// in flight per partition on average, so that the owners' batches carry
// more than one.
const batchedWriters = 48

// figuresBatched runs four kvstore nodes as processes on one PostgreSQL
// schema, with 48 retrying clients writing through two of them, and puts
// the owners' batched path (sqlfence.Batcher) through three faults:
//
//   - a pause past the lease mid-batch: a write to one of the stopped
//     node's partitions is held after its gate (faultctl's hold) while the
//     others write beside it, and a batch of another of its partitions is
//     in flight, waiting inside its fenced transaction for a row the test
//     holds (blockABatch); the node is stopped with SIGSTOP and the row
//     let go: the batch's transaction idles with the fence's row locked
//     until the server ends its session
//     (idle_in_transaction_session_timeout), and the others take the
//     node's partitions over and fence them; after SIGCONT the held write
//     goes into the Batcher under its old token, and its batch must be
//     refused by the fence (counted in the node's stale_rejected), and the
//     batch in flight must fail;
//   - a kill mid-commit: another owner gets SIGKILL with batches
//     committing; a call that got no answer is retried by its request id
//     (by the entry node's router, then by the client);
//   - a graceful leave with a full queue: the clients move to keys of the
//     leaver's partitions (four per client), so that its queues are deep,
//     and it gets SIGTERM: its writes drain or fail fast with not-owner,
//     which the router retries at the new owner.
//
// It asserts what the faults must not do: a stale write landed (VerifyLog,
// whose check a batch committed without the fence trips in the same run:
// the negative control), a duplicate commit, an acknowledged write
// missing, a lost update (a key whose final value is older than its last
// acknowledged write), a call of the leave failing at its first attempt;
// and that the held write's batch was refused and the batch in flight
// failed. Figures:
// batch.size_mean, batch.wait_us_p50 and _p99 (the upper end of the
// power-of-two bucket that holds the percentile: the longest queue wait of
// each batch, as kvnode.Stats.BatchWaitLog2 counts them), batch.batches,
// and per fault batch_faults.*: among them duplicates_answered, the
// retries (by request id) that found their write applied already, as after
// a kill mid-commit, and leave.queued_at_sigterm, the leaver's writes
// queued in its Batcher just before its SIGTERM.
func figuresBatched(t *testing.T) {
	dsn := testdb.PostgresSchemaDSN(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ps := spawnCluster(t, dir, 4, "-dsn", dsn, "-fault-control")
	settle(ctx, t, "the cluster to converge", ps...)
	n0, n1, paused, killed := ps[0], ps[1], ps[2], ps[3]
	db, err := kvnode.OpenDB("", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	last := map[*proc]kvnode.Stats{} // each node's counters as last scraped

	// The clients write 16 keys each, until hot holds keys of their own
	// in the leaver's partitions.
	var hot atomic.Pointer[[][]string]
	keyOf := func(w, i int) string {
		if h := hot.Load(); h != nil {
			return (*h)[w][i%len((*h)[w])]
		}
		return fmt.Sprintf("bf/w%d/k%d", w, i%16)
	}
	calls := make(chan call, 1024)
	var all []call
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for c := range calls {
			all = append(all, c)
		}
	}()
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for w := range batchedWriters {
		wg.Add(1)
		go func() { defer wg.Done(); client(lctx, w, []*proc{n0, n1}, keyOf, true, calls) }()
	}
	pause(ctx, time.Second)

	// (a) A pause past the lease, with a write held in the Batcher's way.
	p, old := heldBy(ctx, t, n0, paused.name)
	if err := paused.control(http.MethodPost, fmt.Sprintf("/debug/hold?partition=%d", p), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "a write to wait at the hold", func() bool {
		var v struct{ Waiting bool }
		return paused.control(http.MethodGet, fmt.Sprintf("/debug/hold?partition=%d", p), &v) == nil && v.Waiting
	})
	// And a batch of another of its partitions in flight: the test holds
	// that partition's rows until a batch waits for one, inside its fenced transaction, and lets it go once the node is
	// stopped. The batch's statement then ends, its transaction idles with
	// the fence's row locked, and the server ends the session (the nodes'
	// idle_in_transaction_session_timeout) before the new owner can fence.
	// (On p itself the held write would queue behind that batch, where
	// the lease's end would fail it unsent, not the fence.)
	var p2 uint32
	waitFor(ctx, t, paused.name+" to hold two partitions", func() bool {
		for _, q := range n0.heldPartitions(paused.name) {
			if q != p {
				p2 = q
				return true
			}
		}
		return false
	})
	unblock := blockABatch(ctx, t, db, n0, p2)
	before := paused.stats(t)
	if err := sigstop.Stop(ctx, paused.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	tStop := time.Now()
	unblock()
	settle(ctx, t, "the others to drop the paused node", n0, n1, killed)
	waitFor(ctx, t, "another node to hold the paused node's partition", func() bool {
		h, epoch := n0.holder(p)
		return h != "" && h != paused.name && epoch > old
	})
	pause(ctx, time.Second) // the new owner has fenced the partition before it serves
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	tCont := time.Now()
	waitFor(ctx, t, "the held write to be released", func() bool {
		return paused.control(http.MethodPost, fmt.Sprintf("/debug/release?partition=%d", p), nil) == nil
	})
	// The held write's batch is refused by the fence, and the batch in
	// flight fails with its session: two failed batches at least.
	waitFor(ctx, t, "the fence to refuse the held write's batch, and the batch in flight to fail", func() bool {
		var s kvnode.Stats
		if paused.control(http.MethodGet, "/kv/stats", &s) != nil {
			return false // not answering yet
		}
		return s.StaleRejected > before.StaleRejected && s.BatchesFailed >= before.BatchesFailed+2
	})
	settle(ctx, t, "the paused node to rejoin", ps...)
	pause(ctx, time.Second)

	// (b) A kill mid-commit.
	last[killed] = killed.stats(t)
	tKill := time.Now()
	killed.kill()
	settle(ctx, t, "the survivors to settle after the kill", n0, n1, paused)
	tKilled := time.Now()
	pause(ctx, time.Second)

	// (c) A graceful leave with deep queues: every client writes to the
	// leaver's partitions.
	var leaverParts []uint32
	waitFor(ctx, t, "the rejoined node to hold partitions", func() bool {
		leaverParts = n0.heldPartitions(paused.name)
		return len(leaverParts) > 0
	})
	hot.Store(hotKeys(leaverParts))
	pause(ctx, time.Second)
	last[paused] = paused.stats(t)
	tLeave := time.Now()
	if err := paused.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-paused.exited:
	case <-ctx.Done():
		t.Fatal("the leaving node did not exit")
	}
	settle(ctx, t, "the others to settle after the leave", n0, n1)
	tLeft := time.Now()
	pause(ctx, time.Second)
	stopLoad()
	wg.Wait()
	close(calls)
	<-collected
	last[n0], last[n1] = n0.stats(t), n1.stats(t)

	var (
		acked                                  []call
		unknownFirst, retriedKill, failedPause int
		failedLeave                            []call
	)
	for _, c := range all {
		if c.err == nil {
			acked = append(acked, c)
		}
		if c.firstErr == nil {
			continue
		}
		if transport.IsOutcomeUnknown(c.firstErr) {
			unknownFirst++
		}
		switch {
		case c.end.After(tStop) && c.start.Before(tCont):
			failedPause++
		case c.end.After(tKill) && c.start.Before(tKilled):
			retriedKill++
		case c.end.After(tLeave) && c.start.Before(tLeft):
			failedLeave = append(failedLeave, c)
		}
	}

	rows, stale, err := kvnode.VerifyLog(ctx, db, "bf/")
	if err != nil {
		t.Fatal(err)
	}
	_, dups, err := kvnode.CountDuplicates(ctx, db, "bf/")
	if err != nil {
		t.Fatal(err)
	}
	var ackedIDs []string
	for _, c := range acked {
		ackedIDs = append(ackedIDs, c.id)
	}
	missing, err := missingIDs(ctx, db, ackedIDs)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := lostUpdates(ctx, db, acked)
	if err != nil {
		t.Fatal(err)
	}
	caught := unfencedBatchControl(ctx, t, db, ownership.Token{Partition: p, Epoch: old, Owner: paused.name, Incarnation: 1}, stale)

	var batches, writes, dupAnswers uint64
	wait := make([]uint64, 64)
	for _, s := range last {
		batches += s.Batches
		writes += s.BatchedWrites
		dupAnswers += s.Duplicates
		for i, n := range s.BatchWaitLog2 {
			wait[i] += n
		}
	}
	fmt.Printf("figure: batch.batches %d\n", batches)
	fmt.Printf("figure: batch.size_mean %.2f\n", float64(writes)/float64(max(batches, 1)))
	fmt.Printf("figure: batch.wait_us_p50 %d\n", quantileBound(wait, 50))
	fmt.Printf("figure: batch.wait_us_p99 %d\n", quantileBound(wait, 99))
	fmt.Printf("figure: batch_faults.calls %d\n", len(all))
	fmt.Printf("figure: batch_faults.acked %d\n", len(acked))
	fmt.Printf("figure: batch_faults.never_acked %d\n", len(all)-len(acked))
	fmt.Printf("figure: batch_faults.first_attempt_unknown %d\n", unknownFirst)
	fmt.Printf("figure: batch_faults.pause.refused_by_fence %d\n", last[paused].StaleRejected-before.StaleRejected)
	fmt.Printf("figure: batch_faults.pause.batches_failed %d\n", last[paused].BatchesFailed-before.BatchesFailed)
	fmt.Printf("figure: batch_faults.pause.failed_first_attempts %d\n", failedPause)
	fmt.Printf("figure: batch_faults.kill.retried_calls %d\n", retriedKill)
	fmt.Printf("figure: batch_faults.duplicates_answered %d\n", dupAnswers)
	fmt.Printf("figure: batch_faults.leave.queued_at_sigterm %d\n", last[paused].Queued)
	fmt.Printf("figure: batch_faults.leave.failed_first_attempts %d\n", len(failedLeave))
	fmt.Printf("figure: batch_faults.log_rows %d\n", rows)
	fmt.Printf("figure: batch_faults.stale_writes_landed %d\n", stale)
	fmt.Printf("figure: batch_faults.lost_updates %d\n", lost)
	fmt.Printf("figure: batch_faults.duplicate_commits %d\n", dups)
	fmt.Printf("figure: batch_faults.control.stale_writes_caught %d\n", caught)
	if stale != 0 || dups != 0 || missing != 0 || lost != 0 {
		t.Errorf("%d stale writes landed, %d writes committed twice, %d acknowledged writes not in the database, %d lost updates",
			stale, dups, missing, lost)
	}
	if len(failedLeave) != 0 {
		t.Errorf("%d calls failed at their first attempt during the graceful leave; first: %v", len(failedLeave), failedLeave[0].firstErr)
	}
	if batches == 0 || writes <= batches {
		t.Errorf("%d writes in %d batches: the owners' batches never carried more than one write", writes, batches)
	}
}

// blockABatch locks, in a transaction of its own, the kv rows of
// partition p, and waits until a session waits for one of them: a batch
// of p in flight. It returns the function that ends the transaction,
// letting the batch go on.
func blockABatch(ctx context.Context, t *testing.T, db *sql.DB, entry *proc, p uint32) (unblock func()) {
	t.Helper()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// A key of the test's own in p, written once before the rows are
	// locked and again while they are: the clients can't be counted on for
	// a write to p, since each of them ends up waiting at the hold,
	// retrying the same key (CI failed once at load 16 that way), and a
	// key with no row yet would insert without waiting for the locks. The
	// second write's outcome is no client's: the batch it joins is the one
	// meant to fail.
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("bf/block/%d", i); ring.PartitionString(k, 16) == p {
			key = k
		}
	}
	put := func(ctx context.Context, value string) error {
		ctx, cancel := context.WithTimeout(ctx, retryFor)
		defer cancel()
		ctx, _ = transport.WithRequestID(ctx, "block-"+value)
		_, err := entry.kv.Put(ctx, &kvpb.PutRequest{Key: key, Value: []byte(value)})
		return err
	}
	if err := put(ctx, "before"); err != nil {
		t.Fatalf("writing %s before locking partition %d: %v", key, p, err)
	}
	if _, err := conn.ExecContext(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	unblock = func() {
		_, _ = conn.ExecContext(ctx, `ROLLBACK`)
		conn.Close()
	}
	res, err := conn.ExecContext(ctx, `SELECT 1 FROM kv WHERE partition = $1 FOR UPDATE`, int64(p))
	if err != nil {
		unblock()
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		unblock()
		t.Fatalf("no key of partition %d written yet", p)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = put(ctx, "blocked") }()
	t.Cleanup(func() { <-done })
	waitFor(ctx, t, "a batch to wait for the test's row locks", func() bool {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n)
		return err == nil && n > 0
	})
	return unblock
}

// unfencedBatchControl is figuresBatched's negative control: a batch of
// four log records under t, committed by the same Batcher over plain
// transactions (no fence check) after a newer owner fenced t's partition,
// lands stale writes, and VerifyLog must count each of them. It returns
// how many it counted beyond the stale ones before.
func unfencedBatchControl(ctx context.Context, t *testing.T, db *sql.DB, tok ownership.Token, before int) int {
	t.Helper()
	b, err := sqlfence.NewBatcherFunc(func(ctx context.Context, _ ownership.Token, _ ownership.Mode, fn func(sqlfence.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}, sqlfence.BatchConfig{MaxWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = b.Do(ctx, tok, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO kv_log (partition, epoch, owner, incarnation, key, value, mark_epoch, mark_owner, mark_incarnation)
	SELECT partition_id, $2, $3, $4, $5, '\x00', epoch, owner, incarnation FROM `+sqlfence.DefaultTable+` WHERE partition_id = $1`,
					int64(tok.Partition), int64(tok.Epoch), tok.Owner, fmt.Sprintf("%016x", tok.Incarnation), fmt.Sprintf("bf/control/%d", i))
				return nil, err
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("the control's unfenced batch: %v", err)
		}
	}
	_, stale, err := kvnode.VerifyLog(ctx, db, "bf/")
	if err != nil {
		t.Fatal(err)
	}
	if stale-before != n {
		t.Errorf("negative control: %d stale records committed without the fence, VerifyLog counted %d", n, stale-before)
	}
	return stale - before
}

// lostUpdates counts the keys written by acked calls whose final value is
// older than the last acknowledged write: each key has one writer, which
// sends its next write only once the last is answered or given up, and
// values are the request ids "w<writer>-<seq>", so the final value's seq
// must be at least the last acknowledged one's.
func lostUpdates(ctx context.Context, db *sql.DB, acked []call) (int, error) {
	lastAcked := map[string]int{}
	for _, c := range acked {
		lastAcked[c.key] = max(lastAcked[c.key], seqOf(c.id))
	}
	lost := 0
	for key, want := range lastAcked {
		var v []byte
		if err := db.QueryRowContext(ctx, `SELECT value FROM kv WHERE key = $1`, key).Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, err
		}
		if v == nil || seqOf(string(v)) < want {
			lost++
		}
	}
	return lost, nil
}

// seqOf is the sequence number of request id "w<writer>-<seq>", or -1.
func seqOf(id string) int {
	_, s, _ := strings.Cut(id, "-")
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// hotKeys returns, for each writer, four keys of its own in partitions
// parts (of 16).
func hotKeys(parts []uint32) *[][]string {
	in := map[uint32]bool{}
	for _, p := range parts {
		in[p] = true
	}
	keys := make([][]string, batchedWriters)
	for w := range keys {
		for j := 0; len(keys[w]) < 4; j++ {
			if k := fmt.Sprintf("bf/w%d/h%d", w, j); in[ring.PartitionString(k, 16)] {
				keys[w] = append(keys[w], k)
			}
		}
	}
	return &keys
}

// quantileBound returns the upper end, in µs, of the power-of-two bucket
// of kvnode.Stats.BatchWaitLog2 that holds the q-th percentile of counts.
func quantileBound(counts []uint64, q uint64) uint64 {
	var total, seen uint64
	for _, n := range counts {
		total += n
	}
	for i, n := range counts {
		if seen += n; total > 0 && seen*100 >= total*q {
			return 1 << i
		}
	}
	return 0
}

// heldBy returns a partition that name holds, as p sees it, and its epoch.
func heldBy(ctx context.Context, t *testing.T, p *proc, name string) (uint32, uint64) {
	t.Helper()
	var part uint32
	var epoch uint64
	waitFor(ctx, t, name+" to hold a partition", func() bool {
		parts := p.heldPartitions(name)
		if len(parts) == 0 {
			return false
		}
		part = parts[0]
		_, epoch = p.holder(part)
		return epoch > 0
	})
	return part, epoch
}

// partitions returns the partitions of p's status page, or nil if it
// does not answer.
func (p *proc) partitions() []struct {
	Partition uint32
	Holder    string
	Epoch     uint64
} {
	var v struct {
		Partitions []struct {
			Partition uint32
			Holder    string
			Epoch     uint64
		}
	}
	if p.control(http.MethodGet, "/?format=json", &v) != nil {
		return nil
	}
	return v.Partitions
}

// holder returns the holder of partition part and its epoch, as p sees
// them.
func (p *proc) holder(part uint32) (string, uint64) {
	for _, s := range p.partitions() {
		if s.Partition == part {
			return s.Holder, s.Epoch
		}
	}
	return "", 0
}

// heldPartitions returns the partitions name holds, as p sees it.
func (p *proc) heldPartitions(name string) []uint32 {
	var parts []uint32
	for _, s := range p.partitions() {
		if s.Holder == name {
			parts = append(parts, s.Partition)
		}
	}
	return parts
}

// stats returns the node's counters (/kv/stats), failing the test if it
// does not answer.
func (p *proc) stats(t *testing.T) kvnode.Stats {
	t.Helper()
	var s kvnode.Stats
	if err := p.control(http.MethodGet, "/kv/stats", &s); err != nil {
		t.Fatalf("%s: /kv/stats: %v", p.name, err)
	}
	return s
}

// control sends a request to p's status server and decodes its JSON
// answer into v, if not nil.
func (p *proc) control(method, path string, v any) error {
	req, err := http.NewRequest(method, "http://"+p.ready.Status+path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s on %s: %s", method, path, p.name, resp.Status)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitFor polls cond, within a minute of ctx.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tenuretest.WaitFor(wctx, t, what, cond)
}
