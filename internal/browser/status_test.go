package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenure-go/tenure/coordinator"
)

// pageState is what a person looking at the status page sees, read from
// the DOM and the computed styles.
type pageState struct {
	Refreshes int               `json:"refreshes"`
	Deltas    int               `json:"deltas"`
	Bytes     int               `json:"bytes"`
	Errors    int               `json:"errors"`
	Stale     bool              `json:"stale"`
	Cells     []cellState       `json:"cells"`
	Swatches  map[string]string `json:"swatches"`
	Members   []string          `json:"members"`
	Health    string            `json:"health"`
	Timeline  string            `json:"timeline"`
	Banner    string            `json:"banner"`
	RenderMs  float64           `json:"render_ms"`
	Images    int               `json:"images"`
}

type cellState struct {
	Partition int    `json:"p"`
	Holder    string `json:"holder"`
	Owner     string `json:"owner"`
	State     string `json:"state"`
	Color     string `json:"color"`
}

const readPage = `(() => {
  const d = document.body.dataset, sw = {};
  document.querySelectorAll('#legend .sw').forEach(e => sw[e.dataset.node] = getComputedStyle(e).backgroundColor);
  return {
    refreshes: +d.refreshes || 0, deltas: +d.deltas || 0, bytes: +d.bytes || 0, errors: +d.errors || 0, stale: document.body.classList.contains('stale'),
    cells: [...document.querySelectorAll('#grid .cell')].map(c => ({p: +c.dataset.partition, holder: c.dataset.holder || '',
      owner: c.dataset.owner || '', state: c.dataset.state || '', color: getComputedStyle(c).backgroundColor})),
    swatches: sw,
    members: [...document.querySelectorAll('#memberrows tr')].map(r => r.dataset.node || ''),
    health: document.getElementById('health').innerText, timeline: document.getElementById('changes').innerText,
    banner: document.getElementById('banner').innerText, render_ms: +d.renderMs || 0,
    images: document.querySelectorAll('img').length,
  };
})()`

func read(t *testing.T, ctx context.Context) pageState {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	return s
}

// waitPage reads the page until cond holds or ctx ends.
func waitPage(t *testing.T, ctx context.Context, what string, cond func(pageState) bool) pageState {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s := read(t, ctx)
		if cond(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the page never showed %s; last state: refreshes %d, banner %q, health %q", what, s.Refreshes, s.Banner, s.Health)
		case <-tick.C:
		}
	}
}

// checkMap checks what a person checks first: every partition has its
// cell, each cell names the holder the node reports and has that holder's
// legend color, and different holders have different colors.
func checkMap(t *testing.T, s pageState, st coordinator.Status) {
	t.Helper()
	check(t, len(s.Cells) == st.PartitionCount, "%d cells for %d partitions", len(s.Cells), st.PartitionCount)
	colors := map[string]string{}
	for i, c := range s.Cells {
		if i >= len(st.Partitions) {
			break
		}
		want := st.Partitions[i]
		check(t, c.Partition == i && c.Holder == want.Holder && c.Owner == want.Owner && c.State == want.State,
			"cell %d shows %+v, the node reports %+v", i, c, want)
		check(t, c.Color != "" && c.Color == s.Swatches[c.Holder], "cell %d (holder %s) is %s, its legend swatch %s", i, c.Holder, c.Color, s.Swatches[c.Holder])
		if other, ok := colors[c.Color]; ok && other != c.Holder {
			t.Errorf("holders %s and %s share the color %s", other, c.Holder, c.Color)
		}
		colors[c.Color] = c.Holder
	}
}

// The live page of a running 3-node cluster: all partitions drawn in their
// holders' colors; a crash shows as moving cells, then as cells in the
// survivors' colors within a refresh or two of the node seeing it.
func TestStatusPageLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := startCluster(t, ctx, 3, 64, func(c *coordinator.Config) {
		c.Grace = 3 * time.Second // a wide failover window, so the page sees the partitions move
	})
	srv := httptest.NewServer(nodes[0].StatusHandler())
	defer srv.Close()

	b := New(t, 90*time.Second)
	if err := chromedp.Do(b, chromedp.EmulateViewport(Width, Height), chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	s := waitPage(t, b, "a first refresh", func(s pageState) bool { return s.Refreshes >= 1 })
	st := nodes[0].Status()
	checkMap(t, s, st)
	check(t, len(s.Members) == 3, "members table lists %v", s.Members)
	check(t, strings.Contains(s.Health, "converged yes") && strings.Contains(s.Health, fmt.Sprintf("quorum yes (stable set of 3, v%d)", st.StableVersion)), "health reads %q", s.Health)
	check(t, len(s.Swatches) == 3, "legend %v", s.Swatches)
	Screenshot(t, b, "status-page-3-nodes")

	// A crash: the survivors' pages show node-2's cells moving, then held
	// by the survivors.
	victim := nodes[2]
	watchMoving := `window.__maxMoving = 0; new MutationObserver(() => {
	  window.__maxMoving = Math.max(window.__maxMoving, document.querySelectorAll('#grid .cell.moving').length);
	}).observe(document.getElementById('grid'), {subtree: true, attributes: true});`
	if err := chromedp.Do(b, chromedp.Evaluate[chromedp.Void](watchMoving)); err != nil {
		t.Fatal(err)
	}
	held := victim.Status().Owned
	victim.Close()
	moving := waitPage(t, b, "the crashed node's cells moving", func(s pageState) bool {
		n := 0
		for _, c := range s.Cells {
			if c.Holder == "node-2" && c.State == coordinator.StateMoving {
				n++
			}
		}
		return n == held
	})
	Screenshot(t, b, "status-page-crash-moving")
	check(t, strings.Contains(moving.Timeline, "node-2 failed"), "timeline reads %q", moving.Timeline)

	if err := nodes[0].WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	st = nodes[0].Status()
	if len(st.Members) != 2 {
		t.Fatalf("after the crash the node sees %d members", len(st.Members))
	}
	seen := read(t, b).Refreshes
	s = waitPage(t, b, "the partitions held by the survivors", func(s pageState) bool {
		for _, c := range s.Cells {
			if c.Holder == "node-2" || c.State != coordinator.StateSettled {
				return false
			}
		}
		return true
	})
	check(t, s.Refreshes-seen <= 2, "the moved cells took %d refreshes to show", s.Refreshes-seen)
	checkMap(t, s, nodes[0].Status())
	// The page loaded the status whole once and followed the crash from
	// deltas: what it shows is the node's status.
	check(t, s.Deltas >= 2 && s.Deltas < s.Refreshes, "%d of %d refreshes were deltas", s.Deltas, s.Refreshes)
	maxMoving, err := chromedp.Run(b, chromedp.Evaluate[int](`window.__maxMoving`))
	check(t, err == nil && maxMoving >= held, "at most %d cells were seen moving (%v), node-2 held %d", maxMoving, err, held)
	check(t, len(s.Members) == 2, "members table lists %v", s.Members)
	Screenshot(t, b, "status-page-after-crash")
}

// hugeStatus is a cluster of members nodes and partitions partitions,
// round-robin, as a node would report it.
func hugeStatus(members, partitions int) coordinator.Status {
	st := coordinator.Status{Node: "m0000", Cluster: "big", Incarnation: "0000000000000001", Time: time.Now(),
		Started: true, Converged: true, PartitionCount: partitions, Stable: []string{}, Timeline: []coordinator.MoveGroup{}}
	for i := range members {
		st.Members = append(st.Members, coordinator.MemberStatus{Name: fmt.Sprintf("m%04d", i), GossipAddr: "127.0.0.1:1",
			Held: partitions / members, RingShare: partitions / members, FairShare: float64(partitions) / float64(members)})
	}
	for p := range partitions {
		name := fmt.Sprintf("m%04d", p%members)
		st.Partitions = append(st.Partitions, coordinator.PartitionStatus{Partition: uint32(p), Owner: name, Holder: name,
			Epoch: 1, State: coordinator.StateSettled})
	}
	return st
}

// The page under bad input from its node: an empty cluster, a huge one,
// fields of the wrong type, markup in names, an answer that is not JSON,
// an HTTP error, no answer. It never throws, never renders markup it was
// sent, says when a refresh failed and keeps the last good state, and
// recovers when the node answers again.
func TestStatusPageBadInput(t *testing.T) {
	cfg := coordinator.LocalConfig()
	cfg.Name = "idle"
	cfg.Handler = coordinator.HandlerFuncs{}
	idle, err := coordinator.New(cfg) // never started: an empty status
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	var answer atomic.Pointer[func(http.ResponseWriter)]
	set := func(f func(http.ResponseWriter)) { answer.Store(&f) }
	jsonOf := func(v any) func(http.ResponseWriter) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return func(w http.ResponseWriter) { w.Header().Set("Content-Type", "application/json"); w.Write(b) }
	}
	raw := func(code int, body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { w.WriteHeader(code); io.WriteString(w, body) }
	}
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("format") == "json" {
			if f := answer.Load(); f != nil {
				(*f)(w)
				return
			}
		}
		idle.StatusHandler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	defer close(hang) // before srv.Close: a hung answer ends first

	b := New(t, 4*time.Minute)
	if err := chromedp.Do(b, chromedp.EmulateViewport(Width, Height), chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	// Empty: a node that has not started.
	s := waitPage(t, b, "an empty status", func(s pageState) bool { return s.Refreshes >= 1 })
	check(t, len(s.Cells) == 0 && len(s.Members) == 1 && strings.Contains(s.Health, "table not yet"), "empty: %d cells, members %v, health %q", len(s.Cells), s.Members, s.Health)
	check(t, strings.Contains(s.Timeline, "no changes seen yet"), "empty timeline reads %q", s.Timeline)
	Screenshot(t, b, "status-page-empty")

	// Huge: 1000 members, 4096 partitions.
	set(jsonOf(hugeStatus(1000, 4096)))
	// Each wait is for what the page shows, not for a refresh count: a
	// fetch in flight when the answer changes still brings the old one.
	s = waitPage(t, b, "the huge cluster", func(s pageState) bool { return len(s.Cells) == 4096 })
	check(t, len(s.Cells) == 4096 && len(s.Members) == 1000 && len(s.Swatches) == 1000, "huge: %d cells, %d members, %d swatches", len(s.Cells), len(s.Members), len(s.Swatches))
	for i, c := range s.Cells {
		if c.Color != s.Swatches[c.Holder] {
			t.Fatalf("huge: cell %d of %s is %s, its swatch %s", i, c.Holder, c.Color, s.Swatches[c.Holder])
		}
	}
	checks.Add(1)
	Screenshot(t, b, "status-page-huge")

	// Hostile: markup in names, fields of the wrong types.
	evil := `<img src=x onerror="window.__pwned=1">`
	set(func(w http.ResponseWriter) {
		io.WriteString(w, `{"node":`+strconv.Quote(evil)+`,"started":"yes","partition_count":"many",
		"members":[1,null,{"name":`+strconv.Quote(evil)+`,"held":"x","fair_share":-5}],
		"partitions":[null,7,{"partition":"0","holder":`+strconv.Quote(evil)+`,"state":"<b>"}],
		"timeline":[{"causes":[{"kind":"failed","node":`+strconv.Quote(evil)+`}],"moves":"no"}, 3]}`)
	})
	s = waitPage(t, b, "the hostile status", func(s pageState) bool { return len(s.Cells) == 3 })
	check(t, s.Images == 0, "the page rendered markup it was sent: %d img elements", s.Images)
	check(t, len(s.Cells) == 3 && s.Cells[2].Holder == evil && s.Cells[2].State == "unowned", "hostile cells %+v", s.Cells)
	check(t, strings.Contains(s.Timeline, evil+" failed"), "hostile timeline %q", s.Timeline)
	pwned, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.__pwned === 1`))
	check(t, err == nil && !pwned, "a name ran script (%v)", err)

	// Deltas: a whole status with a version, then a delta from it with
	// rows out of range and fields of the wrong types: the page applies
	// what fits and throws nothing.
	set(jsonOf(coordinator.StatusDelta{Status: hugeStatus(2, 3), Version: "v1", Full: true}))
	s = waitPage(t, b, "a versioned status", func(s pageState) bool { return len(s.Cells) == 3 && s.Cells[2].Holder == "m0000" })
	deltas := s.Deltas
	set(raw(200, `{"version":"v2","since":"v1","full":false,"partition_count":3,"members":"x","removed_members":5,
		"timeline":[null,{"seq":"a","moves":null}],"stable":7,
		"partitions":[{"partition":99999},{"partition":-1},null,{"partition":1,"holder":"m0000","owner":"m0001","state":"elsewhere"}]}`))
	s = waitPage(t, b, "the delta", func(s pageState) bool { return s.Deltas > deltas })
	check(t, len(s.Cells) == 3 && s.Cells[1].Holder == "m0000" && s.Cells[1].State == "elsewhere" && s.Cells[0].Holder == "m0000" &&
		s.Cells[2].Holder == "m0000", "after a hostile delta: %+v", s.Cells)
	check(t, len(s.Members) == 2, "after a hostile delta: members %v", s.Members)

	// Not JSON, an HTTP error, no answer: the banner says so, the last
	// good state stays.
	for _, c := range []struct {
		name, banner string
		answer       func(http.ResponseWriter)
	}{
		{"garbage", "Refresh failed", raw(200, "\x00\xffnot json{{")},
		{"not an object", "not a status object", raw(200, `[1,2,3]`)},
		{"http error", "HTTP 500", raw(500, "boom")},
		{"no answer", "no answer within", func(http.ResponseWriter) { <-hang }},
	} {
		set(c.answer)
		s = waitPage(t, b, c.name+" reported", func(s pageState) bool { return s.Stale && strings.Contains(s.Banner, c.banner) })
		check(t, strings.Contains(s.Banner, c.banner) && strings.Contains(s.Banner, "Showing what the node said at"), "%s: banner %q", c.name, s.Banner)
		check(t, len(s.Cells) == 3, "%s: the last good state is gone: %d cells", c.name, len(s.Cells))
	}
	Screenshot(t, b, "status-page-refresh-failed")

	set(jsonOf(hugeStatus(3, 64)))
	s = waitPage(t, b, "the recovery", func(s pageState) bool { return !s.Stale && len(s.Cells) == 64 })
	check(t, len(s.Members) == 3, "recovered: members %v", s.Members)
	errs := Errors(t, b)
	check(t, len(errs) == 0, "the page threw: %v", errs)
}
