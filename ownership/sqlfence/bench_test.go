package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// txBench runs one small transaction, an upsert of a key/value row, with or
// without the fence check.
type txBench struct {
	db   *sql.DB
	f    *sqlfence.Fence
	kv   *kv
	tok  ownership.Token
	keys []string
}

func newTxBench(tb testing.TB, be backend) *txBench {
	db := be.open(tb)
	f := newFence(tb, db, be.dialect)
	x := &txBench{db: db, f: f, kv: newKV(tb, db, paths()[0]), tok: fencetest.Tok(1, 1, "bench", 1)}
	ctx := testkit.Ctx(tb, 60*time.Second)
	if _, err := f.Fence(ctx, x.tok); err != nil {
		tb.Fatal(err)
	}
	for i := range 1000 {
		x.keys = append(x.keys, fmt.Sprintf("key-%04d", i))
	}
	return x
}

// value changes on every write, so that each transaction writes a page.
func (x *txBench) value(i int) string { return strconv.Itoa(i) }

func (x *txBench) unfenced(ctx context.Context, i int) error {
	tx, err := x.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, x.kv.upsert, x.keys[i%len(x.keys)], x.value(i)); err != nil {
		return err
	}
	return tx.Commit()
}

func (x *txBench) fenced(ctx context.Context, i int) error {
	return x.f.Do(ctx, x.tok, ownership.Exact, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, x.kv.upsert, x.keys[i%len(x.keys)], x.value(i))
		return err
	})
}

// fencedConn is fenced run by DoConn.
func (x *txBench) fencedConn(ctx context.Context, i int) error {
	return x.f.DoConn(ctx, x.tok, ownership.Exact, func(tx sqlfence.Tx) error {
		_, err := tx.ExecContext(ctx, x.kv.upsert, x.keys[i%len(x.keys)], x.value(i))
		return err
	})
}

// oneMore is unfenced with one statement more, SELECT 1, sent with BEGIN
// as DoConn sends its check: the least any check in the transaction can
// cost (PostgreSQL only).
func (x *txBench) oneMore(ctx context.Context, i int) error {
	conn, err := x.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN; SELECT 1"); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, x.kv.upsert, x.keys[i%len(x.keys)], x.value(i)); err != nil {
		conn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	return err
}

// kinds are the transactions compared: unfenced, Do, DoConn, and on
// PostgreSQL oneMore.
func (x *txBench) kinds(be backend) []func(context.Context, int) error {
	k := []func(context.Context, int) error{x.unfenced, x.fenced, x.fencedConn}
	if be.dialect.String() == "postgres" {
		k = append(k, x.oneMore)
	}
	return k
}

func benchTx(b *testing.B, kind int) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			x := newTxBench(b, be)
			run := x.kinds(be)[kind]
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := run(ctx, i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUnfencedTx: one upsert in a transaction, without a fence.
func BenchmarkUnfencedTx(b *testing.B) { benchTx(b, 0) }

// BenchmarkFencedTx: the same transaction run by Fence.Do (Exact).
func BenchmarkFencedTx(b *testing.B) { benchTx(b, 1) }

// BenchmarkFencedConn: the same transaction run by Fence.DoConn (Exact).
func BenchmarkFencedConn(b *testing.B) { benchTx(b, 2) }

// farDelay is what TestFigures' distant PostgreSQL adds to each direction
// of a round trip: a server across a network. This machine's timers fire
// a little late (about 0.1 ms here); TestFigures prints the round trip it
// measured.
const farDelay = time.Millisecond

// figureBackends are the backends, plus PostgreSQL farDelay away.
func figureBackends() []backend {
	far := backend{name: "postgres_far", dialect: sqlfence.Postgres(), open: func(t testing.TB) *sql.DB {
		return withPool(testdb.PostgresPublicDelayed(t, farDelay))
	}}
	return append(backends(), far)
}

// roundTrip is the median time of an empty statement on db.
func roundTrip(t *testing.T, db *sql.DB) time.Duration {
	ctx := testkit.Ctx(t, 60*time.Second)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var d []time.Duration
	for range 50 {
		start := time.Now()
		if _, err := conn.ExecContext(ctx, ";"); err != nil {
			t.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	return d[len(d)/2]
}

// TestFigures prints the throughput of fenced transactions relative to the
// same transactions unfenced, per dialect: the time spent on unfenced
// transactions over the time spent on as many fenced ones, run interleaved
// (each round runs the three kinds in a rotating order) so that drift in
// the machine's speed hits all alike. A stalled fsync or a descheduled
// process costs milliseconds, far more than the fence, so the slowest
// tenth of each kind is left out.
//
// fenced_over_unfenced is DoConn, whose check rides with BEGIN (target
// 0.95); do_tx_over_unfenced is Do, which hands fn a *sql.Tx and so
// costs one round trip more on PostgreSQL; select1_over_unfenced is the
// unfenced transaction with SELECT 1 sent with BEGIN, the ceiling for any
// check that is a statement of its own. postgres_far is the same server
// behind a proxy that adds farDelay to each direction (rtt_ms is the round
// trip measured through it): on loopback,
// client and server share two cores and a round trip costs little more
// than the CPU of its statement, so the check, a statement the server
// runs, weighs more than it would across any network. Timing on a shared
// machine is noisy, so the test asserts only a loose bound.
func TestFigures(t *testing.T) {
	const (
		warmup = 50
		rounds = 400
	)
	for _, be := range figureBackends() {
		x := newTxBench(t, be)
		kinds := x.kinds(be)
		if be.name == "postgres_far" {
			fmt.Printf("figure: sqlfence.%s.rtt_ms %.2f\n", be.name, float64(roundTrip(t, x.db).Microseconds())/1000)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // each backend's run
		took := make([][]time.Duration, len(kinds))
		for i := range warmup + rounds {
			for j := range kinds {
				k := (i + j) % len(kinds)
				start := time.Now()
				if err := kinds[k](ctx, len(kinds)*i+k); err != nil {
					t.Fatalf("%s: %v", be.name, err)
				}
				if i >= warmup {
					took[k] = append(took[k], time.Since(start))
				}
			}
		}
		cancel()
		sum := make([]time.Duration, len(kinds))
		median := make([]time.Duration, len(kinds))
		for k, d := range took {
			slices.Sort(d)
			median[k] = d[len(d)/2]
			for _, x := range d[:len(d)*9/10] {
				sum[k] += x
			}
		}
		conn := float64(sum[0]) / float64(sum[2])
		do := float64(sum[0]) / float64(sum[1])
		fmt.Printf("figure: sqlfence.%s.fenced_over_unfenced %.2f\n", be.name, conn)
		fmt.Printf("figure: sqlfence.%s.do_tx_over_unfenced %.2f\n", be.name, do)
		if len(kinds) > 3 {
			fmt.Printf("figure: sqlfence.%s.select1_over_unfenced %.2f\n", be.name, float64(sum[0])/float64(sum[3]))
		}
		t.Logf("%s: median unfenced %v, Do %v, DoConn %v", be.name, median[0], median[1], median[2])
		if conn < 0.5 {
			t.Errorf("%s: DoConn throughput %.2fx unfenced, far below the 0.95 target", be.name, conn)
		}
	}
	batchFigures(t)
	batchCheckFigures(t)
}
