//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
)

// The demo's report as a picture: one self-contained HTML file (inline
// SVG and CSS, no script, nothing loaded from elsewhere) with the
// workload's throughput and failures over time, each fault marked, the
// failover and handoff windows shaded, the stale writes the fences
// rejected marked where they happened, and the final checks.

// mark is an event of the run: a fault injected or undone, at a time since
// the run began.
type mark struct {
	at   time.Duration
	name string
}

// window is a span the cluster took to settle after a fault.
type window struct {
	from, to time.Duration
	label    string
	failover bool // a failover (the old owner did not hand off) rather than a handoff
}

// check is one of the demo's final checks.
type check struct {
	Name  string
	Value string
	OK    bool
	// Shown: the row is reported with its verdict but does not decide the
	// run (allPassed skips it).
	Shown bool
}

// staleSampler records when the nodes' fences rejected stale writes: it
// reads every node's counters twice a second and notes each increase.
type staleSampler struct {
	d      *demo
	client *http.Client
	mu     sync.Mutex
	last   map[string]uint64 // by node name: the counter last read
	at     []time.Duration   // one entry per rejection
	stop   func()
}

func (d *demo) sampleStale() *staleSampler {
	s := &staleSampler{d: d, client: &http.Client{Timeout: 300 * time.Millisecond}, last: map[string]uint64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			s.sample()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			s.sample() // the last rejections, after the workload ended
		})
	}
	return s
}

// sample reads each live node's stale counter; a node that does not answer
// (paused, gone) is read again next time, and a restarted node (a counter
// that went down) starts from zero.
func (s *staleSampler) sample() {
	var wg sync.WaitGroup
	for _, p := range s.d.list() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := s.client.Get("http://" + p.status + "/kv/stats")
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var st kvnode.Stats
			if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
				return
			}
			at := time.Since(s.d.t0)
			s.mu.Lock()
			defer s.mu.Unlock()
			prev, seen := s.last[p.name]
			if seen && st.StaleRejected < prev {
				prev = 0 // restarted
			}
			for range st.StaleRejected - min(prev, st.StaleRejected) {
				s.at = append(s.at, at)
			}
			s.last[p.name] = st.StaleRejected
		}()
	}
	wg.Wait()
}

func (s *staleSampler) times() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.at...)
}

// report is everything the picture shows.
type report struct {
	RunID    string
	Started  time.Time
	Setup    string
	Duration time.Duration
	OK       bool
	Checks   []check
	history  []op
	marks    []mark
	windows  []window
	stale    []time.Duration
}

// Chart geometry, in SVG user units.
const (
	chartW, plotH = 1200, 270
	padL, padR    = 64, 20
	padB          = 48
	bucket        = 250 * time.Millisecond
	plotW         = chartW - padL - padR
	faultLabel    = 14 // line height of the fault labels
)

// svgChart is the chart's shapes, computed in Go for the template.
type svgChart struct {
	W, H, PlotTop, PlotBottom, PlotLeft, PlotRight, PlotH int
	Acked, Reads                                          string // polyline points
	Failed                                                []svgRect
	Windows                                               []svgWindow
	ReadBack                                              *svgRect // after the last write: every key read back
	Marks                                                 []svgMark
	Stale                                                 []svgStale
	XTicks, YTicks                                        []svgTick
	YMax                                                  int
}

type svgRect struct{ X, Y, W, H float64 }

type svgWindow struct {
	X, W     float64
	Label    string
	Failover bool
	Seconds  string
	At       string
}

type svgMark struct {
	X       float64
	Anchor  string // "start", or "end" near the right edge
	DX      int
	Label   string
	LabelY  int
	At      string
	Recover bool
}

type svgStale struct {
	X  float64
	At string
}

type svgTick struct {
	Pos   float64
	Label string
}

// chart turns the history into per-bucket rates and lays out the shapes.
// Time runs from the workload's first call (the nodes' start before it is
// left out) to the end of the run.
func (r *report) chart() svgChart {
	origin := time.Duration(-1)
	var lastPut time.Duration
	for _, o := range r.history {
		if origin < 0 || time.Duration(o.start) < origin {
			origin = time.Duration(o.start)
		}
		if o.put {
			lastPut = max(lastPut, time.Duration(o.start))
		}
	}
	origin = max(origin, 0)
	span := max(r.Duration-origin, bucket)
	n := int(span/bucket) + 1
	acked, reads, failed := make([]float64, n), make([]float64, n), make([]float64, n)
	at := func(ns int64) int { return min(max(int((time.Duration(ns)-origin)/bucket), 0), n-1) }
	for _, o := range r.history {
		switch {
		case o.put && o.end == unknownEnd:
			failed[at(o.start)]++
		case o.put:
			acked[at(o.end)]++
		default:
			reads[at(o.end)]++
		}
	}
	perSec := float64(time.Second / bucket)
	peak := 1.0
	for i := range n {
		acked[i] *= perSec
		reads[i] *= perSec
		failed[i] *= perSec
		peak = max(peak, acked[i], reads[i], failed[i])
	}
	yMax := niceCeil(peak)
	x := func(d time.Duration) float64 {
		return padL + float64(plotW)*min(max((d-origin).Seconds()/span.Seconds(), 0), 1)
	}
	since := func(d time.Duration) string { return fmt.Sprintf("%.1f s", (d - origin).Seconds()) }

	// The fault labels go on rows above the plot, each on the first row
	// where it does not overlap the label before it.
	var rowEnd []float64
	c := svgChart{W: chartW, PlotLeft: padL, PlotRight: padL + plotW, PlotH: plotH, YMax: yMax}
	rows := make([]int, len(r.marks))
	for i, m := range r.marks {
		w := 6.8 * float64(len(m.name))
		from := x(m.at) + 4
		if from+w > padL+plotW {
			from = x(m.at) - 4 - w
		}
		row := 0
		for row < len(rowEnd) && rowEnd[row]+10 > from {
			row++
		}
		if row == len(rowEnd) {
			rowEnd = append(rowEnd, 0)
		}
		rowEnd[row] = from + w
		rows[i] = row
	}
	top := 24 + faultLabel*len(rowEnd)
	c.PlotTop, c.PlotBottom, c.H = top, top+plotH, top+plotH+padB
	y := func(v float64) float64 { return float64(top) + float64(plotH)*(1-v/float64(yMax)) }
	for i, m := range r.marks {
		anchor, dx := "start", 4
		if x(m.at)+4+6.8*float64(len(m.name)) > padL+plotW {
			anchor, dx = "end", -4
		}
		c.Marks = append(c.Marks, svgMark{X: x(m.at), Anchor: anchor, DX: dx, Label: m.name,
			LabelY: top - 8 - faultLabel*rows[i], At: since(m.at), Recover: isRecovery(m.name)})
	}

	points := func(vs []float64) string {
		b := make([]byte, 0, 16*len(vs))
		for i, v := range vs {
			b = fmt.Appendf(b, "%.1f,%.1f ", x(origin+time.Duration(i)*bucket+bucket/2), y(v))
		}
		return string(b)
	}
	c.Acked, c.Reads = points(acked), points(reads)
	bw := float64(plotW) * bucket.Seconds() / span.Seconds()
	for i, v := range failed {
		if v > 0 {
			c.Failed = append(c.Failed, svgRect{X: x(origin + time.Duration(i)*bucket), Y: y(v), W: max(bw-1, 1), H: y(0) - y(v)})
		}
	}
	if lastPut > origin {
		from := x(lastPut)
		c.ReadBack = &svgRect{X: from, Y: float64(top), W: padL + plotW - from, H: plotH}
	}
	for _, w := range r.windows {
		c.Windows = append(c.Windows, svgWindow{X: x(w.from), W: max(x(w.to)-x(w.from), 2), Label: w.label,
			Failover: w.failover, Seconds: fmt.Sprintf("%.2f s", (w.to - w.from).Seconds()), At: since(w.from)})
	}
	for _, s := range r.stale {
		c.Stale = append(c.Stale, svgStale{X: x(s), At: fmt.Sprintf("%.2f s", (s - origin).Seconds())})
	}
	step := tickStep(span.Seconds())
	for s := 0.0; s <= span.Seconds(); s += step {
		c.XTicks = append(c.XTicks, svgTick{Pos: x(origin + time.Duration(s*float64(time.Second))), Label: fmt.Sprintf("%gs", s)})
	}
	for i := 0; i <= 4; i++ {
		v := yMax * i / 4
		c.YTicks = append(c.YTicks, svgTick{Pos: y(float64(v)), Label: fmt.Sprint(v)})
	}
	return c
}

// isRecovery tells the events that undo a fault from the faults.
func isRecovery(name string) bool {
	for _, w := range []string{"resumed", "restart", "healed", "pressure off"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) int {
	p := 1
	for p*10 <= int(v) {
		p *= 10
	}
	for _, m := range []int{1, 2, 5, 10} {
		if float64(m*p) >= v {
			return m * p
		}
	}
	return 10 * p
}

func tickStep(total float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 20, 30, 60, 120, 300} {
		if total/s <= 12 {
			return s
		}
	}
	return 600
}

// write renders the report to path.
func (r *report) write(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = reportPage.Execute(f, struct {
		*report
		Chart svgChart
	}{r, r.chart()})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

var reportPage = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tenure demo report {{.RunID}}</title>
<style>
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2330;background:#f6f7f9}
header{padding:14px 24px;background:#1d2330;color:#fff}
header h1{margin:0;font-size:19px;font-weight:600}
header p{margin:2px 0 0;color:#b8c2d0;font-size:13px}
main{padding:16px 24px;max-width:1260px}
section{background:#fff;border:1px solid #d8dde4;border-radius:6px;padding:12px 16px;margin-bottom:14px}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.06em;color:#5f6b7a;margin:0 0 8px}
.verdict{font-size:16px;font-weight:600;padding:10px 16px;border-radius:6px;margin-bottom:14px}
.verdict.ok{background:#e8f5e9;color:#2e7d32;border:1px solid #a5d6a7}
.verdict.bad{background:#ffebee;color:#c62828;border:1px solid #ef9a9a}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;fill:#5f6b7a}
svg .fault text{fill:#1d2330;font-weight:600}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:12px;color:#5f6b7a;margin-top:6px}
.legend i{display:inline-block;width:14px;height:10px;margin-right:5px;vertical-align:middle;border-radius:2px}
table{border-collapse:collapse;width:100%}
td,th{text-align:left;padding:5px 8px;border-bottom:1px solid #eef0f3}
th{color:#5f6b7a;font-size:12px}
td.ok{color:#2e7d32;font-weight:600}
td.bad{color:#c62828;font-weight:600}
</style></head><body>
<header><h1>tenure demo report</h1><p>run {{.RunID}} · {{.Started.Format "2006-01-02 15:04:05"}} · {{.Setup}} · {{printf "%.1f" .Duration.Seconds}} s</p></header>
<main>
<div class="verdict {{if .OK}}ok{{else}}bad{{end}}" id="verdict">{{if .OK}}Every check passed: no acknowledged write lost, no stale write accepted, the history is linearizable.{{else}}A check FAILED: see the checks below.{{end}}</div>
<section><h2>The workload through every fault</h2>
<svg id="chart" viewBox="0 0 {{.Chart.W}} {{.Chart.H}}" width="100%" role="img" aria-label="throughput and failures over time, with the faults marked">
{{range .Chart.Windows}}<rect class="window {{if .Failover}}failover{{else}}handoff{{end}}" x="{{printf "%.1f" .X}}" y="{{$.Chart.PlotTop}}" width="{{printf "%.1f" .W}}" height="{{$.Chart.PlotH}}" fill="{{if .Failover}}#ffcdd2{{else}}#c8e6c9{{end}}" fill-opacity=".6" data-label="{{.Label}}" data-seconds="{{.Seconds}}"><title>{{.Label}}: {{.Seconds}}</title></rect>
{{end}}
{{with .Chart.ReadBack}}<rect class="readback" x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .Y}}" width="{{printf "%.1f" .W}}" height="{{printf "%.1f" .H}}" fill="#eceff1"/>{{end}}
{{range .Chart.YTicks}}<line x1="{{$.Chart.PlotLeft}}" x2="{{$.Chart.PlotRight}}" y1="{{printf "%.1f" .Pos}}" y2="{{printf "%.1f" .Pos}}" stroke="#eef0f3"/><text x="{{$.Chart.PlotLeft | printf "%d"}}" dx="-6" y="{{printf "%.1f" .Pos}}" dy="4" text-anchor="end">{{.Label}}</text>
{{end}}
{{range .Chart.XTicks}}<text x="{{printf "%.1f" .Pos}}" y="{{$.Chart.PlotBottom}}" dy="20" text-anchor="middle">{{.Label}}</text>
{{end}}
<text x="{{$.Chart.PlotLeft}}" y="{{$.Chart.PlotTop}}" dx="-56" dy="-14">calls/s</text>
<text x="{{$.Chart.PlotRight}}" y="{{$.Chart.PlotBottom}}" dy="40" text-anchor="end">seconds since the workload began</text>
{{range .Chart.Failed}}<rect class="failed" x="{{printf "%.1f" .X}}" y="{{printf "%.1f" .Y}}" width="{{printf "%.1f" .W}}" height="{{printf "%.1f" .H}}" fill="#e53935"/>
{{end}}
<polyline class="acked" points="{{.Chart.Acked}}" fill="none" stroke="#1e63b5" stroke-width="2"/>
<polyline class="reads" points="{{.Chart.Reads}}" fill="none" stroke="#43a047" stroke-width="1.5"/>
<line x1="{{.Chart.PlotLeft}}" x2="{{.Chart.PlotRight}}" y1="{{.Chart.PlotBottom}}" y2="{{.Chart.PlotBottom}}" stroke="#1d2330"/>
{{range .Chart.Marks}}<g class="fault{{if .Recover}} recovery{{end}}" data-label="{{.Label}}" data-at="{{.At}}"><line x1="{{printf "%.1f" .X}}" x2="{{printf "%.1f" .X}}" y1="{{.LabelY}}" y2="{{$.Chart.PlotBottom}}" stroke="{{if .Recover}}#2e7d32{{else}}#1d2330{{end}}" stroke-width="1.5" {{if .Recover}}stroke-dasharray="4 3"{{end}}/><text x="{{printf "%.1f" .X}}" y="{{.LabelY}}" dx="{{.DX}}" dy="-2" text-anchor="{{.Anchor}}">{{.Label}}</text><title>{{.Label}} at {{.At}}</title></g>
{{end}}
{{range .Chart.Stale}}<path class="stale" d="M{{printf "%.1f" .X}},{{$.Chart.PlotBottom}} l-6,12 h12 z" fill="#c62828" data-at="{{.At}}"><title>stale write rejected by the fence at {{.At}}</title></path>
{{end}}
</svg>
<div class="legend"><span><i style="background:#1e63b5"></i>acknowledged writes/s</span><span><i style="background:#43a047"></i>reads/s</span><span><i style="background:#e53935"></i>failed or timed-out writes/s (the client retries)</span><span><i style="background:#ffcdd2"></i>failover: the others take over a node that did not hand off</span><span><i style="background:#c8e6c9"></i>handoff / settling after a planned change</span><span><i style="background:#c62828;clip-path:polygon(50% 0,100% 100%,0 100%)"></i>a stale write rejected by a fence</span><span><i style="background:#eceff1"></i>writers stopped: every key read back</span><span><i style="background:#1d2330;width:2px"></i>fault</span><span><i style="background:#2e7d32;width:2px"></i>its undoing</span></div>
</section>
<section><h2>Checks</h2><table id="checks"><tr><th>check</th><th>result</th><th></th></tr>
{{range .Checks}}<tr><td>{{.Name}}</td><td>{{.Value}}</td><td class="{{if .OK}}ok{{else}}bad{{end}}">{{if .OK}}pass{{else}}FAIL{{end}}{{if .Shown}} (not judged){{end}}</td></tr>
{{end}}</table></section>
<section><h2>How long each change took to settle</h2><table id="windows"><tr><th>change</th><th>at</th><th>settled after</th></tr>
{{range .Chart.Windows}}<tr><td>{{.Label}}</td><td>{{.At}}</td><td>{{.Seconds}}</td></tr>
{{end}}</table></section>
</main></body></html>
`))

// story is what the run did and when, for the report: the faults and
// their undoing as they happened, and how long the cluster took to settle.
type story struct {
	t0      time.Time
	mu      sync.Mutex
	marks   []mark
	windows []window
}

// mark records an event now.
func (s *story) mark(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marks = append(s.marks, mark{at: time.Since(s.t0), name: name})
}

// settled records a settling that ended now and took took.
func (s *story) settled(label string, took time.Duration, failover bool) {
	now := time.Now()
	s.settledAt(label, now.Add(-took), now, failover)
}

// settledAt records a settling from from to to.
func (s *story) settledAt(label string, from, to time.Time, failover bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.windows = append(s.windows, window{from: from.Sub(s.t0), to: to.Sub(s.t0), label: label, failover: failover})
}

// writeReport writes the picture of the run to the -report path (or a new
// file in the temporary directory) and returns the path.
func (d *demo) writeReport(history []op, stale []time.Duration, checks []check) (string, error) {
	d.story.mu.Lock()
	marks, windows := slices.Clone(d.story.marks), slices.Clone(d.story.windows)
	d.story.mu.Unlock()
	r := &report{RunID: d.runID, Started: d.t0, Duration: time.Since(d.t0), Checks: checks,
		Setup:   d.setup(),
		history: history, marks: marks, windows: windows, stale: stale}
	r.OK = allPassed(checks)
	path := d.cfg.report
	if path == "" {
		path = filepath.Join(os.TempDir(), "tenure-demo-"+d.runID+"-report.html")
	}
	return path, r.write(path)
}

// setup is the report's line on the run's shape, saying whether its phases
// ran under -pressure.
func (d *demo) setup() string {
	s := fmt.Sprintf("%d nodes, %d partitions, %d writers x %d keys", d.cfg.nodes, d.cfg.partitions, d.cfg.writers, d.cfg.keys)
	if d.cfg.pressure {
		s += fmt.Sprintf(", every phase under CPU pressure (%d busy loops per core, between the marks pressure on and off)", busyLoopsPerCore)
	}
	return s
}
