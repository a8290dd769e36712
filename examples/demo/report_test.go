//go:build unix

package main

import (
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenure-go/tenure/internal/browser"
)

// demoEvents are the faults and their undoing that a run injects, as the
// progress line and the report name them.
var demoEvents = []string{
	"pause node-3 (SIGSTOP)", "node-3 resumed (SIGCONT)", "crash node-1 (SIGKILL)", "restart node-1",
	"network cut {0,1} | {2,3,4}", "network healed", "graceful leave of node-2",
}

// reportView is what a person sees in the report.
type reportView struct {
	Faults     []string `json:"faults"`
	FaultAt    []string `json:"fault_at"`
	Recoveries int      `json:"recoveries"`
	Windows    []string `json:"windows"`
	Failovers  int      `json:"failovers"`
	Stale      []string `json:"stale"`
	Failed     int      `json:"failed"`
	AckedPts   int      `json:"acked_points"`
	Checks     []string `json:"checks"`
	Verdict    string   `json:"verdict"`
	ChartW     float64  `json:"chart_w"`
	External   int      `json:"external"`
}

const readReport = `(() => {
  const q = s => [...document.querySelectorAll(s)];
  return {
    faults: q('#chart g.fault').map(g => g.dataset.label), fault_at: q('#chart g.fault').map(g => g.dataset.at),
    recoveries: q('#chart g.fault.recovery').length,
    windows: q('#chart rect.window').map(r => r.dataset.label), failovers: q('#chart rect.window.failover').length,
    stale: q('#chart path.stale').map(p => p.dataset.at), failed: q('#chart rect.failed').length,
    acked_points: (document.querySelector('#chart polyline.acked').getAttribute('points').trim().split(/\s+/)).length,
    checks: q('#checks tr').slice(1).map(r => r.innerText.replace(/\s+/g, ' ').trim()),
    verdict: document.getElementById('verdict').innerText,
    chart_w: document.getElementById('chart').getBoundingClientRect().width,
    external: q('[src],[href],link,script').length,
  };
})()`

// viewReport opens the report file in Chromium, reads it and saves a
// screenshot.
func viewReport(t *testing.T, path, shot string) reportView {
	t.Helper()
	b := browser.New(t, time.Minute)
	u := url.URL{Scheme: "file", Path: path}
	if err := chromedp.Do(b, chromedp.EmulateViewport(browser.Width, browser.Height), chromedp.Navigate(u.String())); err != nil {
		t.Fatal(err)
	}
	v, err := chromedp.Run(b, chromedp.Evaluate[reportView](readReport))
	if err != nil {
		t.Fatalf("reading the report: %v", err)
	}
	browser.Screenshot(t, b, shot)
	if errs := browser.Errors(t, b); len(errs) > 0 {
		t.Errorf("the report threw: %v", errs)
	}
	return v
}

// syntheticRun is a run of known shape: steady calls, a fault every 4 s,
// failures during the failovers, two stale rejections.
func syntheticRun() (*demo, []op, []time.Duration) {
	d := &demo{cfg: config{nodes: 5, partitions: 64, writers: 4, keys: 8}, runID: "test", t0: time.Now().Add(-30 * time.Second)}
	d.story.t0 = d.t0
	for i, name := range demoEvents {
		d.story.marks = append(d.story.marks, mark{at: time.Duration(i+1) * 4 * time.Second, name: name})
	}
	var h []op
	for ms := int64(0); ms < 29000; ms += 10 {
		start := ms * int64(time.Millisecond)
		h = append(h, op{put: true, start: start, end: start + int64(5*time.Millisecond)})
		if ms%40 == 0 {
			h = append(h, op{start: start, end: start + int64(2*time.Millisecond)})
		}
		if (ms > 4000 && ms < 6500) || (ms > 12000 && ms < 14500) {
			h = append(h, op{put: true, start: start, end: unknownEnd})
		}
	}
	d.story.windows = []window{
		{4 * time.Second, 6500 * time.Millisecond, "paused node-3's partitions taken over", true},
		{12 * time.Second, 14600 * time.Millisecond, "crashed node-1's partitions failed over", true},
		{28 * time.Second, 28400 * time.Millisecond, "node-2 left, handing off", false},
	}
	return d, h, []time.Duration{9 * time.Second, 9 * time.Second}
}

// The report draws what happened: one marker per fault and per undoing,
// labeled and in order, a shaded window per settling, a marker per stale
// rejection, the failures as bars, and the checks with a verdict.
func TestReportPicture(t *testing.T) {
	d, h, stale := syntheticRun()
	d.cfg.report = filepath.Join(t.ArtifactDir(), "report.html")
	checks := []check{{Name: "acknowledged writes lost", Value: "0", OK: true}, {Name: "history linearizable", Value: "ok", OK: true}}
	path, err := d.writeReport(h, stale, checks)
	if err != nil {
		t.Fatal(err)
	}
	v := viewReport(t, path, "demo-report-synthetic")
	if !slices.Equal(v.Faults, demoEvents) || v.Recoveries != 3 {
		t.Errorf("fault markers %v (%d recoveries), want %v", v.Faults, v.Recoveries, demoEvents)
	}
	if want := []string{"4.0 s", "8.0 s", "12.0 s", "16.0 s", "20.0 s", "24.0 s", "28.0 s"}; !slices.Equal(v.FaultAt, want) {
		t.Errorf("faults at %v, want %v", v.FaultAt, want)
	}
	if len(v.Windows) != 3 || v.Failovers != 2 || len(v.Stale) != 2 || v.Stale[0] != "9.00 s" {
		t.Errorf("windows %v (%d failovers), stale %v", v.Windows, v.Failovers, v.Stale)
	}
	if v.Failed != 20 || v.AckedPts < 100 {
		t.Errorf("%d failure bars (want 20: two 2.5 s windows of 250 ms buckets), %d throughput points", v.Failed, v.AckedPts)
	}
	if len(v.Checks) != 2 || !strings.Contains(v.Checks[0], "pass") || !strings.Contains(v.Verdict, "Every check passed") {
		t.Errorf("checks %q, verdict %q", v.Checks, v.Verdict)
	}
	if v.External != 0 || v.ChartW < 800 {
		t.Errorf("%d references outside the file, chart %.0f px wide", v.External, v.ChartW)
	}

	// The negative control: a failed check turns the verdict.
	checks[1].OK = false
	d.cfg.report = filepath.Join(t.ArtifactDir(), "report-failed.html")
	if path, err = d.writeReport(h, stale, checks); err != nil {
		t.Fatal(err)
	}
	v = viewReport(t, path, "demo-report-failed-check")
	if !strings.Contains(v.Verdict, "FAILED") || !strings.Contains(v.Checks[1], "FAIL") {
		t.Errorf("a failed check reads %q, verdict %q", v.Checks, v.Verdict)
	}
}

// checkRunReport checks the report of a real run (TestDemoShort): a
// marker for each of events, the faults it injected, a settling window
// for each, and the held
// write's refusal marked after the paused node resumed.
func checkRunReport(t *testing.T, path string, events []string) {
	t.Helper()
	v := viewReport(t, path, "demo-report")
	if !slices.Equal(v.Faults, events) {
		t.Fatalf("the report marks %v, the demo injected %v", v.Faults, events)
	}
	if len(v.Windows) != len(events) || v.Failovers != 3 {
		t.Errorf("settling windows %v (%d failovers)", v.Windows, v.Failovers)
	}
	var resumed float64
	fmt.Sscanf(v.FaultAt[slices.Index(v.Faults, "node-3 resumed (SIGCONT)")], "%g", &resumed)
	after := false
	for _, s := range v.Stale {
		var at float64
		fmt.Sscanf(s, "%g", &at)
		after = after || at >= resumed
	}
	if !after {
		t.Errorf("no stale rejection marked after node-3 resumed at %.1f s: %v", resumed, v.Stale)
	}
	for _, row := range []string{"calls failed during the graceful leave (L2)", "unknown outcomes during the graceful leave (L2)"} {
		if !slices.ContainsFunc(v.Checks, func(c string) bool { return strings.HasPrefix(c, row) }) {
			t.Errorf("the report's checks %q have no row %q", v.Checks, row)
		}
	}
	if !strings.Contains(v.Verdict, "Every check passed") {
		t.Errorf("verdict %q, checks %q", v.Verdict, v.Checks)
	}
}

// With -pressure the report's setup line says the phases ran under CPU
// pressure, and the mark that ends it is drawn as an undoing; without it
// the line says nothing of pressure.
func TestReportMarksPressure(t *testing.T) {
	d := &demo{cfg: config{nodes: 5, partitions: 32, writers: 8, keys: 32}}
	if s := d.setup(); strings.Contains(s, "pressure") {
		t.Errorf("setup without -pressure = %q, want no pressure", s)
	}
	d.cfg.pressure = true
	if s := d.setup(); !strings.Contains(s, "every phase under CPU pressure (2 busy loops per core") {
		t.Errorf("setup with -pressure = %q, want it to say the phases ran under pressure", s)
	}
	if !isRecovery("pressure off") || isRecovery("pressure on: 4 busy loops") {
		t.Error("pressure off must be drawn as the undoing of pressure on")
	}
}
