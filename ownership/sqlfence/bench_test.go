package sqlfence_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
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
	x := &txBench{db: db, f: f, kv: newKV(tb, db), tok: tok(1, 1, "bench", 1)}
	ctx, cancel := testContext(tb)
	defer cancel()
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

func benchTx(b *testing.B, fenced bool) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			x := newTxBench(b, be)
			run := x.unfenced
			if fenced {
				run = x.fenced
			}
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

// BenchmarkFencedTx: one upsert in a transaction run by Fence.Do (Exact).
func BenchmarkFencedTx(b *testing.B) { benchTx(b, true) }

// BenchmarkUnfencedTx: the same transaction without the fence check.
func BenchmarkUnfencedTx(b *testing.B) { benchTx(b, false) }

// TestFigures prints the throughput of fenced transactions relative to the
// same transactions unfenced, per dialect: the time spent on unfenced
// transactions over the time spent on as many fenced ones, run interleaved
// so that drift in the machine's speed hits both alike. A stalled fsync or
// a descheduled process costs milliseconds, far more than the fence, so
// the slowest tenth of each kind is left out. The target is 0.8; timing on
// a shared machine is noisy, so the test asserts a looser bound.
func TestFigures(t *testing.T) {
	const (
		warmup = 50
		pairs  = 400
	)
	for _, be := range backends() {
		x := newTxBench(t, be)
		ctx, cancel := testContext(t)
		var took [2][]time.Duration // unfenced, fenced
		for i := range warmup + pairs {
			order := [2]int{0, 1}
			if i%2 == 1 {
				order = [2]int{1, 0}
			}
			for _, slot := range order {
				run := x.unfenced
				if slot == 1 {
					run = x.fenced
				}
				start := time.Now()
				if err := run(ctx, 2*i+slot); err != nil {
					t.Fatalf("%s: %v", be.name, err)
				}
				if i >= warmup {
					took[slot] = append(took[slot], time.Since(start))
				}
			}
		}
		cancel()
		var sum, median [2]time.Duration
		for slot, d := range took {
			slices.Sort(d)
			median[slot] = d[len(d)/2]
			for _, x := range d[:len(d)*9/10] {
				sum[slot] += x
			}
		}
		ratio := float64(sum[0]) / float64(sum[1])
		fmt.Printf("figure: sqlfence.%s.fenced_over_unfenced %.2f\n", be.name, ratio)
		t.Logf("%s: median unfenced %v, fenced %v", be.name, median[0], median[1])
		if ratio < 0.5 {
			t.Errorf("%s: fenced throughput %.2fx unfenced, far below the 0.8 target", be.name, ratio)
		}
	}
}
