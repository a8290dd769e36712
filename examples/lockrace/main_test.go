package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/ownership/sqlfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFigures runs the program short: every guard's throughput beside the
// others' in one run, and the pause scenario. It asserts what does not
// depend on timing: under tenure (and the advisory lock, whose lock dies
// with the paused session) the paused holder's write is kept out; under
// the locks that expire in a service beside the store, and with no guard
// (the control, which shows the check can see a stale write), it lands.
// No guard but the control loses an update.
//
// It runs the workload twice: as the program does by default (8 clients,
// 271 partitions: the figures named locks and batch), and with 64 clients
// writing to the same keys spread over 16 partitions (locks_c64_p16,
// batch_c64_p16), where more writes of a partition arrive together than
// it has batches in flight, so the Batcher's batches carry more than one
// write (asserted: 64 clients, one write in flight each, over at most 16
// batches in flight). Each runs with the services on loopback as they
// are, and behind proxies that add 1 ms to each direction of a round trip
// (locks_far...), as across a network.
func TestFigures(t *testing.T) {
	for _, w := range []struct{ clients, partitions int }{{8, 271}, {64, 16}} {
		for _, delay := range []time.Duration{0, time.Millisecond} {
			t.Run(fmt.Sprintf("clients=%d/partitions=%d/delay=%v", w.clients, w.partitions, delay), func(t *testing.T) {
				figures(t, w.clients, w.partitions, delay)
			})
		}
	}
}

func figures(t *testing.T, clients, partitions int, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := defaultConfig()
	cfg.duration, cfg.rounds, cfg.delay = 2*time.Second, 2, delay
	cfg.clients, cfg.partitions = clients, partitions
	rep, err := measure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.print(&out, cfg)
	fmt.Print(out.String())
	for name, want := range map[string]bool{"unguarded": true, "tenure": false, "advisory": false, "redsync": true, "etcd_mutex": true, "tenure_batched": false, "unguarded_batched": true} {
		if rep.landed[name] != want {
			t.Errorf("%s: stale write landed = %v, want %v", name, rep.landed[name], want)
		}
	}
	for _, name := range guardNames[1:] {
		if r := rep.results[name]; r.lost != 0 || r.failed != 0 || r.ops == 0 {
			t.Errorf("%s: %d writes, %d lost, %d failed", name, r.ops, r.lost, r.failed)
		}
	}
	prefix := cfg.prefix("locks")
	for _, g := range []string{"tenure", "tenure_batched"} {
		if !strings.Contains(out.String(), "figure: "+prefix+"."+g+".stale_writes_landed 0") {
			t.Errorf("the report does not print %s's stale writes", g)
		}
	}
	if clients >= 2*partitions && (rep.batchSize <= 1 || rep.unguardedBatchSize <= 1) {
		t.Errorf("%d clients over %d partitions: batches carried %.2f writes on average (%.2f unguarded); want more than one",
			clients, partitions, rep.batchSize, rep.unguardedBatchSize)
	}
}

// BenchmarkGuards: one increment under each guard, from parallel
// clients, a quarter of them on four hot keys (the program's workload).
func BenchmarkGuards(b *testing.B) {
	ctx := context.Background()
	cfg := defaultConfig()
	e, st, gs, err := setup(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.close()
	w := workload{clients: cfg.clients, keys: cfg.keyNames(), hot: cfg.hot, hotShare: cfg.hotShare}
	for _, g := range gs {
		b.Run(g.name(), func(b *testing.B) {
			var seed atomic.Uint64
			b.SetParallelism(max(1, cfg.clients/2)) // 2 cores: cfg.clients goroutines
			b.RunParallel(func(pb *testing.PB) {
				wk, err := g.worker(ctx, "node-0")
				if err != nil {
					b.Error(err)
					return
				}
				defer wk.close()
				rng := rand.New(rand.NewPCG(seed.Add(1), 3))
				for pb.Next() {
					key := w.key(rng)
					if err := do(ctx, wk, key, func(q sqlfence.Tx) error { return st.increment(ctx, q, key, g.name()) }); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
