package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ring"
)

func getStatus(t *testing.T, srv *httptest.Server) (Status, map[string]any) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/?format=json")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var st Status
	var raw map[string]any
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	return st, raw
}

func TestStatusPageAndMetrics(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "s", 2)
	a := tc.node("s0")

	srv := httptest.NewServer(a.c.StatusHandler())
	defer srv.Close()
	st, _ := getStatus(t, srv)
	if st.Node != "s0" || len(st.Members) != 2 || len(st.Partitions) != testPartitions || !st.Converged ||
		st.PartitionCount != testPartitions || !st.Started || len(st.Incarnation) != 16 {
		t.Fatalf("status = %+v", st)
	}
	local, held := 0, 0
	for _, p := range st.Partitions {
		if p.State != StateSettled {
			t.Fatalf("converged, yet partition row %+v", p)
		}
		if p.Local {
			local++
			if p.Owner != "s0" || p.Holder != "s0" || p.Epoch == 0 {
				t.Fatalf("local partition row %+v", p)
			}
		}
	}
	for _, m := range st.Members {
		held += m.Held
		if m.FairShare != float64(testPartitions)/2 || m.Held != m.RingShare || m.Self != (m.Name == "s0") {
			t.Fatalf("member row %+v", m)
		}
	}
	if local == 0 || local != st.Owned || held != testPartitions {
		t.Fatalf("%d local rows, owned %d, held %d", local, st.Owned, held)
	}

	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `id="grid"`) || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatal("HTML status page missing")
	}
	// The page loads nothing from elsewhere: no URL in it but its own.
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//|url\(|@import`).Find(page); m != nil {
		t.Fatalf("the page refers outside itself: %q", m)
	}
	resp, err = srv.Client().Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST answered %v", resp.Status)
	}

	reg := prometheus.NewRegistry()
	if err := reg.Register(a.c.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["tenure_members"] != 2 || got["tenure_owned_partitions"] != float64(st.Owned) || got["tenure_claims_total"] == 0 {
		t.Fatalf("metrics = %v", got)
	}
}

// docFields reads the JSON field list from Status's doc comment: for each
// documented object (the path of its parent fields, "" for the top), its
// field names in order, and the documented type of every field.
func docFields(t *testing.T) (map[string][]string, map[string]string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "status.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	ast.Inspect(f, func(n ast.Node) bool {
		if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				if s.(*ast.TypeSpec).Name.Name == "Status" {
					doc = g.Doc.Text()
				}
			}
		}
		return true
	})
	line := regexp.MustCompile(`^\t((?:  )*)([a-z_]+) +(string|bool|number|\[\]string|\[\]object|\[\]number) `)
	fields, types := map[string][]string{}, map[string]string{}
	var path []string
	for _, l := range strings.Split(doc, "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		depth := len(m[1]) / 2
		if depth > len(path) {
			t.Fatalf("doc line %q is indented under nothing", l)
		}
		path = path[:depth]
		parent := strings.Join(path, ".")
		fields[parent] = append(fields[parent], m[2])
		types[strings.Join(append(slices.Clone(path), m[2]), ".")] = m[3]
		path = append(path, m[2])
	}
	if len(fields[""]) < 10 {
		t.Fatalf("found only %v in Status's doc comment", fields[""])
	}
	return fields, types
}

// Every field the JSON has is documented in Status's doc comment under
// that name and type, and every documented field is in the JSON, at every
// level; no name is in Go's CamelCase.
func TestStatusJSONMatchesItsDoc(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "j", 3)
	srv := httptest.NewServer(tc.node("j0").c.StatusHandler())
	defer srv.Close()
	// A crash gives the timeline a "failed" cause and moves.
	tc.remove("j1").c.Close()
	tc.waitConverged(ctx)
	_, raw := getStatus(t, srv)

	fields, types := docFields(t)
	seen := map[string]bool{}
	var walk func(path string, obj map[string]any)
	walk = func(path string, obj map[string]any) {
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := slices.Sorted(slices.Values(fields[path]))
		if !slices.Equal(keys, want) {
			t.Errorf("JSON object at %q has fields %v; the doc lists %v", path, keys, want)
		}
		for k, v := range obj {
			full := strings.TrimPrefix(path+"."+k, ".")
			seen[full] = true
			if !regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`).MatchString(k) {
				t.Errorf("field %q is not snake_case", full)
			}
			switch types[full] {
			case "string":
				_, ok := v.(string)
				if !ok {
					t.Errorf("%s = %#v, documented as a string", full, v)
				}
			case "bool":
				if _, ok := v.(bool); !ok {
					t.Errorf("%s = %#v, documented as a bool", full, v)
				}
			case "number":
				if _, ok := v.(float64); !ok {
					t.Errorf("%s = %#v, documented as a number", full, v)
				}
			default:
				list, ok := v.([]any)
				if !ok {
					t.Errorf("%s = %#v, documented as %s", full, v, types[full])
					continue
				}
				for _, e := range list {
					if o, ok := e.(map[string]any); ok {
						walk(full, o)
					}
				}
			}
		}
	}
	walk("", raw)
	for parent, names := range fields {
		for _, n := range names {
			if full := strings.TrimPrefix(parent+"."+n, "."); !seen[full] {
				t.Errorf("documented field %s never appeared in the JSON", full)
			}
		}
	}
}

// The negative control of the doc check: a field added to the JSON but not
// to the doc, or documented but gone, is caught by the same comparison.
func TestStatusDocCheckCatchesDrift(t *testing.T) {
	fields, _ := docFields(t)
	b, err := json.Marshal(Status{})
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	delete(raw, "owned")
	raw["Owned"] = 1
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range raw {
			if !yield(k) {
				return
			}
		}
	})
	if slices.Equal(keys, slices.Sorted(slices.Values(fields[""]))) {
		t.Fatal("a renamed field went unnoticed")
	}
}

// The timeline groups the moves of one table change under its causes,
// tells a crash (left holding partitions) from a handoff, and counts the
// partitions not yet held by their new owner.
func TestStatusTimelineGroups(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Quorum is not under test: the last node keeps claiming on its own.
	tc := newTestCluster(t, func(c *Config) { c.MinQuorum = 1 })
	tc.startNodes(ctx, "t", 3)
	a := tc.node("t0")
	before := len(a.c.Status().Timeline)

	tc.remove("t2").c.Close() // a crash
	tc.waitConverged(ctx)
	st := a.c.Status()
	var crash []MoveGroup
	for _, g := range st.Timeline[before:] {
		if slices.ContainsFunc(g.Causes, func(c Cause) bool { return c.Node == "t2" }) {
			crash = append(crash, g)
		}
	}
	if len(crash) != 1 {
		t.Fatalf("one crash made %d groups: %+v", len(crash), st.Timeline[before:])
	}
	g := crash[0]
	if len(g.Causes) != 1 || g.Causes[0].Kind != "failed" || g.Causes[0].Node != "t2" || g.Causes[0].Held == 0 {
		t.Fatalf("crash group causes %+v", g.Causes)
	}
	n, total := 0, 0
	for _, m := range g.Moves {
		if m.To != "t0" && m.To != "t1" {
			t.Fatalf("crash moved %+v", m)
		}
		if m.From == "t2" {
			n += len(m.Partitions)
		}
		total += len(m.Partitions)
	}
	// Bounded loads may move a few partitions between the survivors too.
	if n != g.Causes[0].Held || g.Moved != total || g.Superseded {
		t.Fatalf("crash group %+v (moved %d)", g, n)
	}

	before = len(st.Timeline)
	if err := tc.remove("t1").c.Leave(ctx); err != nil { // a handoff
		t.Fatal(err)
	}
	tc.waitConverged(ctx)
	// The leaver drops out of the table when it announces the leave, while
	// it still holds its partitions, and is gone once it handed them off.
	// The partitions can settle before memberlist reports the leaver gone,
	// so the second cause is waited for while the group holds only the
	// first; anything else fails at once.
	want := []Cause{{Kind: "leaving", Node: "t1"}, {Kind: "left", Node: "t1"}}
	var tl []MoveGroup
	err := testkit.Check(ctx, func() error {
		tl = a.c.Status().Timeline[before:]
		if len(tl) == 1 && slices.Equal(tl[0].Causes, want[:1]) {
			return fmt.Errorf("leave's group has causes %+v so far", tl[0].Causes)
		}
		return nil
	})
	if err != nil || len(tl) != 1 || !slices.Equal(tl[0].Causes, want) || tl[0].Pending != 0 {
		t.Fatalf("leave made %+v (%v)", tl, err)
	}
}

// Pending counts what the register shows not yet held by the new owner;
// a group replaced before it settled is superseded. The negative control
// is a register that shows the moves done.
func TestTimelinePending(t *testing.T) {
	reg, err := gossip.NewRegister(4)
	if err != nil {
		t.Fatal(err)
	}
	var tl timeline
	t1 := mustTable(t, []string{"a"}, 4)
	t2 := mustTable(t, []string{"a", "b"}, 4)
	now := time.Unix(100, 0)
	tl.observe(Event{Kind: EventMemberJoined, Node: "a", Time: now}, t1, reg)
	if g := tl.snapshot(reg); len(g) != 1 || g[0].Moved != 4 || g[0].Pending != 4 || g[0].Causes[0].Kind != "joined" {
		t.Fatalf("first table: %+v", g)
	}
	for p := range uint32(4) {
		reg.Observe(ownership.Token{Partition: p, Epoch: 1, Owner: "a", Incarnation: 1})
	}
	if g := tl.snapshot(reg); g[0].Pending != 0 {
		t.Fatalf("all claimed, still pending: %+v", g)
	}
	tl.observe(Event{Kind: EventMemberJoined, Node: "b", Time: now}, t2, reg)
	g := tl.snapshot(reg)
	if len(g) != 2 || g[0].Superseded || g[1].Pending != g[1].Moved || g[1].Moved == 0 {
		t.Fatalf("after b joined: %+v", g)
	}
	tl.observe(Event{Kind: EventMemberLeft, Node: "b", Time: now}, t1, reg)
	g = tl.snapshot(reg)
	if len(g) != 3 || !g[1].Superseded || g[2].Causes[0].Kind != "left" {
		t.Fatalf("b left before its partitions moved: %+v", g)
	}
	for i := range 2 * maxGroups {
		tl.observe(Event{Kind: EventMemberJoined, Node: "b", Time: now}, []*ring.Table{t1, t2}[i%2], reg)
	}
	if n := len(tl.snapshot(reg)); n != maxGroups {
		t.Fatalf("timeline holds %d groups, want at most %d", n, maxGroups)
	}
}

func mustTable(t *testing.T, names []string, partitions int) *ring.Table {
	t.Helper()
	cfg := ring.DefaultConfig()
	cfg.Partitions = partitions
	tb, err := ring.New(names, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// Before Start the status is empty but complete: lists are [] and the page
// can say there is no table yet.
func TestStatusBeforeStart(t *testing.T) {
	cfg := testConfig("idle")
	cfg.Handler = HandlerFuncs{}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c.StatusHandler())
	defer srv.Close()
	st, raw := getStatus(t, srv)
	if st.Started || st.Converged || st.PartitionCount != 0 {
		t.Fatalf("status before start %+v", st)
	}
	for _, k := range []string{"members", "partitions", "timeline", "stable"} {
		if l, ok := raw[k].([]any); !ok || len(l) != 0 {
			t.Errorf("%s = %#v before start, want []", k, raw[k])
		}
	}
}
