package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// batchCheckFigures weighs, on PostgreSQL, what DoConn's check costs a
// batch, beside the checks that might cost less, in CPU: on this machine
// the clients and the server share two cores, so a batch's CPU, not its
// round trips, bounds the throughput on loopback, and CPU time, unlike
// wall time, barely moves with the load of other processes. 16 flushers,
// one per partition as a Batcher's, each commit batches of two writes (a
// read and an update of a row, as lockrace's):
//
//   - bare: BEGIN, the writes, COMMIT, as unguarded batches commit;
//   - select1: "BEGIN; SELECT 1", the writes, "SELECT 1; COMMIT": DoConn's
//     messages with a check that checks nothing;
//   - exact: DoConn itself, whose check locks the partition's row (FOR NO
//     KEY UPDATE: an xmax written to the row, a WAL record per batch);
//   - plain: as select1 with the check as a plain read of the row, without
//     the lock (not a fence: a fence landing meanwhile would not wait);
//   - advisory: the plain read under the partition's advisory lock taken
//     shared, as a lock-free check could keep the fence's guarantee.
//
// Figures sqlfence.postgres.batch_check.<kind>.server_us and .client_us:
// CPU per batch of the server's sessions (from /proc, Linux; the server
// must run on this machine) and of this process, over rounds that
// alternate the kinds; .cpu_over_bare: bare's CPU per batch over the
// kind's, the throughput ratio a machine whose CPU is the bottleneck
// would see. The sessions' CPU is sampled by the kernel at each tick, so
// each figure moves by a few percent from run to run.
func batchCheckFigures(t *testing.T) {
	const (
		flushers = 16
		batches  = 100 // per flusher and round
		rounds   = 6
		writes   = 2
	)
	app := fmt.Sprintf("batch_check_%d", time.Now().UnixNano())
	dsn := testdb.PostgresSchemaDSN(t)
	if strings.Contains(dsn, "://") {
		dsn += "&application_name=" + app
	} else {
		dsn += " application_name=" + app
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the fence table's cleanup
	db.SetMaxOpenConns(2 * flushers) // the flushers' own, and DoConn's
	db.SetMaxIdleConns(2 * flushers)
	f, table := newFenceTable(t, db, sqlfence.Postgres(), sqlfence.Config{})
	// ctx bounds a stuck server; budget bounds the run on a busy machine
	// (stop 29's second CI try here: the package took 212 s beside the
	// other packages, and the rounds outlasted a 60 s ctx): rounds past the
	// first measured one start only within it, and the figures say how
	// many ran.
	ctx := testkit.Ctx(t, 3*time.Minute)
	budget := time.Now().Add(slowtest.Scale(30 * time.Second))
	if _, err := db.ExecContext(ctx, `CREATE TABLE batch_check_kv (k TEXT PRIMARY KEY, v BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO batch_check_kv SELECT 'p' || p || '-' || i, 0 FROM generate_series(0, $1) p, generate_series(0, 15) i`, flushers-1); err != nil {
		t.Fatal(err)
	}
	toks := make([]ownership.Token, flushers)
	conns := make([]*sql.Conn, flushers)
	for p := range flushers {
		toks[p] = fencetest.Tok(uint32(p), 1, "bench", 1)
		if _, err := f.Fence(ctx, toks[p]); err != nil {
			t.Fatal(err)
		}
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, `PREPARE batch_check_plain (BIGINT, BIGINT, TEXT, TEXT) AS SELECT 1 FROM `+table+
			` WHERE partition_id = $1 AND epoch = $2 AND owner = $3 AND incarnation = $4`); err != nil {
			t.Fatal(err)
		}
		conns[p] = c
	}
	write := func(ctx context.Context, tx sqlfence.Tx, p, i int) error {
		for w := range writes {
			k := fmt.Sprintf("p%d-%d", p, (i*writes+w)%16)
			var v int64
			if err := tx.QueryRowContext(ctx, `SELECT v FROM batch_check_kv WHERE k = $1`, k).Scan(&v); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE batch_check_kv SET v = $2 WHERE k = $1`, k, v+1); err != nil {
				return err
			}
		}
		return nil
	}
	// onConn runs a batch on p's connection between begin and commit.
	onConn := func(begin func(p int) string, commit string) func(ctx context.Context, p, i int) error {
		return func(ctx context.Context, p, i int) error {
			c := conns[p]
			if _, err := c.ExecContext(ctx, begin(p)); err != nil {
				return err
			}
			if err := write(ctx, c, p, i); err != nil {
				_, _ = c.ExecContext(ctx, "ROLLBACK")
				return err
			}
			_, err := c.ExecContext(ctx, commit)
			return err
		}
	}
	const fencedCommit = "SELECT 1; COMMIT" // as DoConn commits
	plain := func(p int) string {
		return fmt.Sprintf("EXECUTE batch_check_plain(%d, 1, 'bench', '%016x')", p, toks[p].Incarnation)
	}
	kinds := []struct {
		name string
		run  func(ctx context.Context, p, i int) error
	}{
		{"bare", onConn(func(int) string { return "BEGIN" }, "COMMIT")},
		{"select1", onConn(func(int) string { return "BEGIN; SELECT 1" }, fencedCommit)},
		{"exact", func(ctx context.Context, p, i int) error {
			return f.DoConn(ctx, toks[p], ownership.Exact, func(tx sqlfence.Tx) error { return write(ctx, tx, p, i) })
		}},
		{"plain", onConn(func(p int) string { return "BEGIN; " + plain(p) }, fencedCommit)},
		{"advisory", onConn(func(p int) string {
			return fmt.Sprintf("BEGIN; SELECT pg_advisory_xact_lock_shared('%s'::regclass::oid::bigint << 32 | %d); %s", table, p, plain(p))
		}, fencedCommit)},
	}
	// The server's sessions: the flushers' connections and DoConn's, all
	// open once every kind has run (the pool keeps them idle).
	server := func() time.Duration {
		rs, err := db.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var cpu time.Duration
		for rs.Next() {
			var pid int
			if err := rs.Scan(&pid); err != nil {
				t.Fatal(err)
			}
			cpu += processCPU(t, pid)
		}
		return cpu
	}
	client := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	serverCPU := make([]time.Duration, len(kinds))
	clientCPU := make([]time.Duration, len(kinds))
	measured := 0
	for r := range rounds + 1 { // round 0 warms up and opens every connection
		if r > 1 && time.Now().After(budget) {
			break
		}
		for j := range kinds {
			k := (r + j) % len(kinds)
			s0, c0 := server(), client()
			var wg sync.WaitGroup
			for p := range flushers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range batches {
						if err := kinds[k].run(ctx, p, i); err != nil {
							t.Errorf("%s: %v", kinds[k].name, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if r > 0 {
				serverCPU[k] += server() - s0
				clientCPU[k] += client() - c0
			}
		}
		if t.Failed() {
			return
		}
		measured = r
	}
	fmt.Printf("figure: sqlfence.postgres.batch_check.rounds %d of %d\n", measured, rounds)
	n := time.Duration(measured * flushers * batches)
	for k, kind := range kinds {
		fmt.Printf("figure: sqlfence.postgres.batch_check.%s.server_us %.1f\n", kind.name, float64((serverCPU[k]/n).Nanoseconds())/1000)
		fmt.Printf("figure: sqlfence.postgres.batch_check.%s.client_us %.1f\n", kind.name, float64((clientCPU[k]/n).Nanoseconds())/1000)
		if k > 0 {
			fmt.Printf("figure: sqlfence.postgres.batch_check.%s.cpu_over_bare %.2f\n", kind.name,
				float64(serverCPU[0]+clientCPU[0])/float64(serverCPU[k]+clientCPU[k]))
		}
	}
}

// processCPU is the CPU time process pid has used (Linux: /proc).
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0 // the session ended meanwhile
	}
	// Fields after the command (in parentheses): utime and stime are the
	// 12th and 13th, in clock ticks (USER_HZ, 100 on Linux).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %q", pid, b)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
