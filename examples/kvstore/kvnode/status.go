package kvnode

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// statusServer serves, for people and tools:
//
//	GET  /             the coordinator's status page (?format=json for JSON)
//	GET  /metrics      Prometheus metrics: the coordinator's and the counters below
//	GET  /kv/stats     the node's counters as JSON (Stats)
//	POST /debug/cut    ?peers=ip:port,... cuts this node off from those gossip
//	                   addresses; no peers heals (only with FaultControl)
//	POST /debug/hold   ?partition=N holds the next write to N before it reaches
//	                   the database (Hold; only with FaultControl)
//	GET  /debug/hold   ?partition=N: {"waiting": true} once a write waits there
//	POST /debug/release ?partition=N lets it go on (Release)
func (n *Node) statusServer() (*http.Server, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(n.c.Collector()); err != nil {
		return nil, err
	}
	for name, v := range map[string]func() uint64{
		"kvstore_puts_applied_total":    n.stats.putsApplied.Load,
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
	mux.Handle("/", n.c.StatusHandler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /kv/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Stats())
	})
	// The fault-control endpoints answer v as JSON, or err.
	answer := func(w http.ResponseWriter, err error, v any) {
		switch {
		case errors.Is(err, errNoFaultControl):
			http.Error(w, err.Error(), http.StatusNotFound)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(v)
		}
	}
	mux.HandleFunc("POST /debug/cut", func(w http.ResponseWriter, r *http.Request) {
		peers := splitPeers(r.URL.Query().Get("peers"))
		answer(w, n.Cut(peers), map[string][]string{"cut": peers})
	})
	// POST /debug/hold, /debug/release and GET /debug/hold, each with
	// ?partition=N: Hold, Release and Holding.
	partitionArg := func(w http.ResponseWriter, r *http.Request) (uint32, bool) {
		p, err := strconv.ParseUint(r.URL.Query().Get("partition"), 10, 32)
		if err != nil {
			http.Error(w, "kvnode: want ?partition=N", http.StatusBadRequest)
			return 0, false
		}
		return uint32(p), true
	}
	mux.HandleFunc("POST /debug/hold", func(w http.ResponseWriter, r *http.Request) {
		if p, ok := partitionArg(w, r); ok {
			answer(w, n.Hold(p), map[string]uint32{"held": p})
		}
	})
	mux.HandleFunc("POST /debug/release", func(w http.ResponseWriter, r *http.Request) {
		if p, ok := partitionArg(w, r); ok {
			answer(w, n.Release(p), map[string]uint32{"released": p})
		}
	})
	mux.HandleFunc("GET /debug/hold", func(w http.ResponseWriter, r *http.Request) {
		if p, ok := partitionArg(w, r); ok {
			var err error
			if n.holds == nil {
				err = errNoFaultControl
			}
			answer(w, err, map[string]bool{"waiting": n.Holding(p)})
		}
	})
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
