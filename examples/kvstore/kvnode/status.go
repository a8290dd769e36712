package kvnode

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// statusServer serves, for people and tools:
//
//	GET  /             the coordinator's status page (?format=json for JSON)
//	GET  /metrics      Prometheus metrics: the coordinator's and the counters below
//	GET  /kv/stats     the node's counters as JSON (Stats)
//
// and Config.StatusHandlers.
func (n *Node) statusServer() (*http.Server, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(n.c.Collector()); err != nil {
		return nil, err
	}
	for name, v := range map[string]func() uint64{
		"kvstore_puts_applied_total":    n.stats.putsApplied.Load,
		"kvstore_duplicates_total":      n.stats.duplicates.Load,
		"kvstore_gets_total":            n.stats.gets.Load,
		"kvstore_stale_rejected_total":  n.stats.staleRejected.Load,
		"kvstore_forwarded_calls_total": n.stats.forwarded.Load,
	} {
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: "See kvnode.Stats."},
			func() float64 { return float64(v()) })
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	mux := http.NewServeMux()
	mux.Handle("GET /{$}", n.c.StatusHandler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /kv/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Stats())
	})
	for pattern, h := range n.cfg.StatusHandlers {
		mux.Handle(pattern, h)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: stopTimeout}, nil
}

// splitPeers splits a comma-separated list of addresses (the -seeds flag,
// the peers parameter of /debug/cut), blanks ignored.
func splitPeers(s string) []string {
	var peers []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			peers = append(peers, p)
		}
	}
	return peers
}
