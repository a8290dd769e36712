package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// workload is what every guard runs: clients incrementing counters, a
// share of them on a few hot keys.
type workload struct {
	clients  int
	keys     []string // the first hot are hot
	hot      int
	hotShare float64
	duration time.Duration
	seed     uint64
}

// result is one guard's throughput run.
type result struct {
	ops, failed int
	took        time.Duration
	latencies   []time.Duration
	lost        int64 // acknowledged increments missing from the counters
}

func (r *result) add(o result) {
	r.ops += o.ops
	r.failed += o.failed
	r.took += o.took
	r.latencies = append(r.latencies, o.latencies...)
	r.lost += o.lost
}

func (r result) opsPerSecond() float64 { return float64(r.ops) / r.took.Seconds() }

// quantile returns the latency at q (0 to 1), in milliseconds.
func (r result) quantile(q float64) float64 {
	if len(r.latencies) == 0 {
		return 0
	}
	d := slices.Clone(r.latencies)
	slices.Sort(d)
	return float64(d[min(len(d)-1, int(q*float64(len(d))))].Microseconds()) / 1000
}

// key picks the key of the next write.
func (w workload) key(rng *rand.Rand) string {
	if w.hot > 0 && rng.Float64() < w.hotShare {
		return w.keys[rng.IntN(w.hot)]
	}
	return w.keys[w.hot+rng.IntN(len(w.keys)-w.hot)]
}

// run resets the counters, runs the workload under g for w.duration, and
// checks the counters against the acknowledged writes.
func (w workload) run(ctx context.Context, st *store, g guard, round int) (result, error) {
	if err := st.reset(ctx, w.keys); err != nil {
		return result{}, err
	}
	workers := make([]worker, w.clients)
	for i := range workers {
		wk, err := g.worker(ctx, "node-0") // every client acts for one owner
		if err != nil {
			return result{}, fmt.Errorf("%s: worker: %w", g.name(), err)
		}
		defer wk.close()
		workers[i] = wk
	}
	var (
		mu    sync.Mutex
		total result
		wg    sync.WaitGroup
		first error
	)
	start := time.Now()
	deadline := start.Add(w.duration)
	for i, wk := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.seed, uint64(round*1000+i)))
			var r result
			for time.Now().Before(deadline) && ctx.Err() == nil {
				key := w.key(rng)
				t0 := time.Now()
				err := do(ctx, wk, key, func(q sqlfence.Tx) error { return st.increment(ctx, q, key, g.name()) })
				if err != nil {
					r.failed++
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("%s: %w", g.name(), err)
					}
					mu.Unlock()
					continue
				}
				r.ops++
				r.latencies = append(r.latencies, time.Since(t0))
			}
			mu.Lock()
			total.add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.took = time.Since(start)
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	if total.ops == 0 {
		return result{}, fmt.Errorf("%s: no write succeeded: %v", g.name(), first)
	}
	sum, err := st.sum(ctx)
	if err != nil {
		return result{}, err
	}
	total.lost = int64(total.ops) - sum
	return total, nil
}
