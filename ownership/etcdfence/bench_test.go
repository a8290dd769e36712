package etcdfence_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// txBench writes one key per transaction, with or without the fence.
type txBench struct {
	c    *clientv3.Client
	f    *etcdfence.Fence
	data string
	tok  ownership.Token
}

func newTxBench(tb testing.TB) *txBench {
	c, f, data := setup(tb, etcdfence.Config{})
	x := &txBench{c: c, f: f, data: data, tok: fencetest.Tok(1, 1, "bench", 1)}
	mustFence(tb, f, x.tok)
	return x
}

func (x *txBench) put(i int) clientv3.Op {
	return clientv3.OpPut(x.data+"k"+strconv.Itoa(i%1000), strconv.Itoa(i))
}

func (x *txBench) unfenced(ctx context.Context, i int) error {
	_, err := x.c.Txn(ctx).Then(x.put(i)).Commit()
	return err
}

func (x *txBench) fenced(ctx context.Context, i int) error {
	_, err := x.f.Do(ctx, x.tok, ownership.Exact, x.put(i))
	return err
}

func benchTx(b *testing.B, fenced bool) {
	x := newTxBench(b)
	run := x.unfenced
	if fenced {
		run = x.fenced
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := run(ctx, i); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnfencedTxn: a transaction of one put.
func BenchmarkUnfencedTxn(b *testing.B) { benchTx(b, false) }

// BenchmarkFencedTxn: the same put in Fence.Do (Exact).
func BenchmarkFencedTxn(b *testing.B) { benchTx(b, true) }

// TestFigures prints the throughput of fenced etcd transactions relative
// to the same transactions unfenced: time spent on unfenced over time
// spent on as many fenced, interleaved, the slowest tenth of each left
// out (a stalled fsync costs more than the fence). Both are one round
// trip; the fence adds a compare to the transaction. Timing is noisy on a
// shared machine, so the test asserts only a loose bound.
func TestFigures(t *testing.T) {
	const warmup, pairs = 50, 400
	x := newTxBench(t)
	ctx := testkit.Ctx(t, 60*time.Second)
	var took [2][]time.Duration
	for i := range warmup + pairs {
		for j := range 2 {
			k := (i + j) % 2
			run := x.unfenced
			if k == 1 {
				run = x.fenced
			}
			start := time.Now()
			if err := run(ctx, 2*i+k); err != nil {
				t.Fatal(err)
			}
			if i >= warmup {
				took[k] = append(took[k], time.Since(start))
			}
		}
	}
	var sum, median [2]time.Duration
	for k, d := range took {
		slices.Sort(d)
		median[k] = d[len(d)/2]
		for _, x := range d[:len(d)*9/10] {
			sum[k] += x
		}
	}
	ratio := float64(sum[0]) / float64(sum[1])
	fmt.Printf("figure: etcdfence.fenced_over_unfenced %.2f\n", ratio)
	t.Logf("median unfenced %v, fenced %v", median[0], median[1])
	if ratio < 0.5 {
		t.Errorf("fenced throughput %.2fx unfenced", ratio)
	}
}

// TestUnreachable: a test whose etcd is down fails, and the message names
// where the endpoints came from.
func TestUnreachable(t *testing.T) {
	t.Setenv("TENURE_ETCD_ENDPOINTS", "127.0.0.1:1")
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		connect(ft)
	}()
	<-done
	if !strings.Contains(ft.msg, "TENURE_ETCD_ENDPOINTS") || !strings.Contains(ft.msg, "unreachable") {
		t.Fatalf("failure message %q, want one naming TENURE_ETCD_ENDPOINTS as unreachable", ft.msg)
	}
}

// fatalT records the message of Fatalf and ends the goroutine, as
// testing.T does, without failing the real test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
