package coordinator

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tenure-go/tenure/ownership"
)

// move is one change of this node's ownership, for the status page.
type move struct {
	Partition uint32          `json:"partition"`
	Token     ownership.Token `json:"-"`
	TokenText string          `json:"token"`
	What      string          `json:"what"`
	Time      time.Time       `json:"time"`
}

// moveLog keeps the most recent moves.
type moveLog struct {
	mu    sync.Mutex
	moves []move
}

const maxMoves = 64

func (l *moveLog) add(m move) {
	m.TokenText = m.Token.String()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.moves) == maxMoves {
		copy(l.moves, l.moves[1:])
		l.moves = l.moves[:maxMoves-1]
	}
	l.moves = append(l.moves, m)
}

func (l *moveLog) recent() []move {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]move(nil), l.moves...)
}

// Status is a snapshot of what this node knows, for people and tools.
type Status struct {
	Node        string             `json:"node"`
	Incarnation uint64             `json:"incarnation"`
	Cluster     string             `json:"cluster"`
	Members     []ownership.Member `json:"members"`
	Partitions  []PartitionStatus  `json:"partitions"`
	Owned       int                `json:"owned"`
	Converged   bool               `json:"converged"`
	RecentMoves []move             `json:"recent_moves"`
}

// PartitionStatus is one row of the partition -> owner map.
type PartitionStatus struct {
	Partition uint32 `json:"partition"`
	Owner     string `json:"owner"`
	Epoch     uint64 `json:"epoch"`
	Holder    string `json:"holder"`
	Released  bool   `json:"released,omitempty"`
	Local     bool   `json:"local,omitempty"`
}

// Status returns a snapshot of this node's view.
func (c *Coordinator) Status() Status {
	s := Status{
		Node:        c.self.Name,
		Incarnation: c.self.Incarnation,
		Cluster:     c.cfg.ClusterName,
		Members:     c.Members(),
		Converged:   c.converged(),
		RecentMoves: c.moves.recent(),
	}
	t := c.Table()
	if t == nil {
		return s
	}
	for p := 0; p < t.Partitions(); p++ {
		cl := c.reg.GetClaim(uint32(p))
		l := c.leases[p].Load()
		local := l != nil && l.Err() == nil
		if local {
			s.Owned++
		}
		s.Partitions = append(s.Partitions, PartitionStatus{
			Partition: uint32(p), Owner: t.Owner(uint32(p)), Epoch: cl.Token.Epoch,
			Holder: cl.Token.Owner, Released: cl.Released, Local: local,
		})
	}
	return s
}

// StatusHandler returns an http.Handler for the status page: HTML for
// browsers, JSON when the request asks for application/json or has
// ?format=json.
func (c *Coordinator) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.Status()
		if r.URL.Query().Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(s)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = statusPage.Execute(w, s)
	})
}

var statusPage = template.Must(template.New("status").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>tenure: {{.Node}}</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}.local{background:#e8f5e9}</style>
</head><body>
<h1>tenure node {{.Node}}</h1>
<p>cluster <b>{{.Cluster}}</b>, incarnation {{printf "%016x" .Incarnation}}, owns {{.Owned}} partitions, converged: {{.Converged}}. <a href="?format=json">JSON</a></p>
<h2>Members</h2>
<table><tr><th>name</th><th>gossip</th><th>service</th></tr>
{{range .Members}}<tr><td>{{.Name}}</td><td>{{.GossipAddr}}</td><td>{{.ServiceAddr}}</td></tr>{{end}}
</table>
<h2>Recent moves on this node</h2>
<table><tr><th>time</th><th>partition</th><th>what</th><th>token</th></tr>
{{range .RecentMoves}}<tr><td>{{.Time.Format "15:04:05.000"}}</td><td>{{.Partition}}</td><td>{{.What}}</td><td>{{.TokenText}}</td></tr>{{end}}
</table>
<h2>Partitions</h2>
<table><tr><th>partition</th><th>ring owner</th><th>holder</th><th>epoch</th><th>released</th></tr>
{{range .Partitions}}<tr{{if .Local}} class="local"{{end}}><td>{{.Partition}}</td><td>{{.Owner}}</td><td>{{.Holder}}</td><td>{{.Epoch}}</td><td>{{.Released}}</td></tr>{{end}}
</table>
</body></html>
`))
