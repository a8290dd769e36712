package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/ownership"
)

// sameStatus reports whether a and b hold the same rows and lists (the
// scalar fields, which every delta carries whole, are not compared).
func sameStatus(a, b Status) bool {
	lists := func(s Status) []byte {
		out, err := json.Marshal([]any{s.Stable, s.Unreachable, s.Members, s.Partitions, s.Timeline})
		if err != nil {
			panic(err)
		}
		return out
	}
	return bytes.Equal(lists(a), lists(b))
}

// fakeStatus is a node's status that a test changes at random.
type fakeStatus struct {
	r    *rand.Rand
	s    Status
	next int // the next member's number
}

func newFakeStatus(seed uint64, partitions int) *fakeStatus {
	f := &fakeStatus{r: rand.New(rand.NewPCG(seed, 1))}
	f.s = Status{Node: "m0", Started: true, PartitionCount: partitions, Stable: []string{}, Unreachable: []string{}}
	for range 5 {
		f.addMember()
	}
	for p := range partitions {
		f.s.Partitions = append(f.s.Partitions, PartitionStatus{Partition: uint32(p), Owner: "m0", Holder: "m0", Epoch: 1, State: StateSettled})
	}
	f.s.Timeline = []MoveGroup{{Seq: 1, Causes: []Cause{}, Moves: []Move{}}}
	return f
}

func (f *fakeStatus) addMember() {
	f.s.Members = append(f.s.Members, MemberStatus{Name: fmt.Sprintf("m%d", f.next), Held: f.r.IntN(9)})
	f.next++
	slices.SortFunc(f.s.Members, func(a, b MemberStatus) int { return strings.Compare(a.Name, b.Name) })
}

// step changes one thing; it returns a copy that later steps don't touch.
func (f *fakeStatus) step() Status {
	s := &f.s
	s.Time = s.Time.Add(time.Second) // scalars change on every reading
	s.Lag++
	switch f.r.IntN(8) {
	case 0, 1, 2: // partitions move
		for range 1 + f.r.IntN(3) {
			p := f.r.IntN(len(s.Partitions))
			m := s.Members[f.r.IntN(len(s.Members))].Name
			s.Partitions[p].Holder, s.Partitions[p].State = m, []string{StateMoving, StateElsewhere, StateSettled}[f.r.IntN(3)]
			s.Partitions[p].Epoch++
		}
	case 3: // held counts
		s.Members[f.r.IntN(len(s.Members))].Held++
	case 4: // a member joins or goes
		if f.r.IntN(2) == 0 && len(s.Members) > 2 {
			i := f.r.IntN(len(s.Members))
			s.Members = slices.Delete(s.Members, i, i+1)
		} else {
			f.addMember()
		}
	case 5: // the timeline grows, or its newest group settles
		last := s.Timeline[len(s.Timeline)-1]
		if f.r.IntN(2) == 0 {
			s.Timeline = append(s.Timeline, MoveGroup{Seq: last.Seq + 1, Causes: []Cause{{Kind: "joined", Node: "x"}},
				Moves: []Move{{From: "a", To: "b", Partitions: []uint32{uint32(f.r.IntN(64))}}}, Pending: 3})
			if len(s.Timeline) > maxGroups {
				s.Timeline = slices.Delete(s.Timeline, 0, 1)
			}
		} else {
			s.Timeline[len(s.Timeline)-1].Pending = f.r.IntN(3)
		}
	case 6: // the stable set or the unreachable list
		if f.r.IntN(2) == 0 {
			s.Stable = append(s.Stable, fmt.Sprint("s", len(s.Stable)))
		} else {
			s.Unreachable = []string{fmt.Sprint("u", f.r.IntN(2))}
		}
	case 7: // nothing but the scalars
	}
	b, err := json.Marshal(f.s)
	if err != nil {
		panic(err)
	}
	var out Status
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

const testInc = "00000000000000aa"

// Deltas applied to the status of the version they start from give the
// current status, from any version the log still keeps; versions it no
// longer keeps, unknown ones and another incarnation's get a full status.
func TestStatusDeltaApply(t *testing.T) {
	for seed := range uint64(4) {
		f := newFakeStatus(seed, 64)
		var l statusLog
		now := time.Unix(1000, 0)
		seen := map[string]Status{} // what a client had at each version
		var versions []string
		cur := f.step()
		for i := range 400 {
			now = now.Add(statusScanEvery)
			since := ""
			if len(versions) > 0 && i%7 != 0 {
				since = versions[f.r.IntN(len(versions))]
			}
			d := l.since(since, testInc, now, func() Status { return cur })
			if !sameStatus(d.Status, cur) && d.Full {
				t.Fatalf("seed %d step %d: a full delta is not the status", seed, i)
			}
			v, _ := parseVersion(since, testInc)
			if wantFull := since == "" || v < l.base; d.Full != wantFull {
				t.Fatalf("seed %d step %d: since %q (kept from %d) full=%v", seed, i, since, l.base, d.Full)
			}
			got, err := seen[since].Apply(d)
			if err != nil || !sameStatus(got, cur) {
				t.Fatalf("seed %d step %d: since %q, the delta %+v applied does not give the status (%v)", seed, i, since, d, err)
			}
			if _, ok := seen[d.Version]; !ok {
				versions = append(versions, d.Version)
			}
			seen[d.Version] = cur
			cur = f.step()
		}
		if l.base == 0 {
			t.Fatalf("seed %d: the log kept all %d versions: it is not bounded", seed, l.seq)
		}
	}
}

// A client that fell behind the changes the log keeps, or has another
// incarnation's version, or a garbled one, gets a full status; one that
// is current gets an empty delta under the same version.
func TestStatusDeltaFellBehind(t *testing.T) {
	f := newFakeStatus(9, 16)
	var l statusLog
	now := time.Unix(1000, 0)
	cur := f.s
	read := func() Status { return cur }
	first := l.since("", testInc, now, read)
	if !first.Full || first.Since != "" {
		t.Fatalf("first answer %+v", first)
	}
	now = now.Add(statusScanEvery)
	idle := l.since(first.Version, testInc, now, read)
	if idle.Full || idle.Version != first.Version || len(idle.Partitions)+len(idle.Members)+len(idle.Timeline) != 0 || idle.Stable != nil {
		t.Fatalf("nothing changed, yet %+v", idle)
	}
	for _, v := range []string{"ff00000000000000.1", "garbage", testInc + ".x", testInc + ".99"} {
		if d := l.since(v, testInc, now, read); !d.Full {
			t.Errorf("since %q: a delta", v)
		}
	}
	for range maxStatusChanges + 1 {
		now = now.Add(statusScanEvery)
		cur.Partitions = slices.Clone(cur.Partitions)
		cur.Partitions[3].Epoch++
		l.since("", testInc, now, read)
	}
	if d := l.since(first.Version, testInc, now, read); !d.Full {
		t.Fatalf("%d versions behind, a delta", maxStatusChanges+1)
	}
	if len(l.entries) > maxStatusChanges {
		t.Fatalf("the log keeps %d changes", len(l.entries))
	}
	// A reading within statusScanEvery of the last is reused, unless an
	// event came.
	before := l.seq
	cur.Partitions = slices.Clone(cur.Partitions)
	cur.Partitions[3].Epoch++
	if l.since("", testInc, now, read); l.seq != before {
		t.Fatal("read the node again within statusScanEvery")
	}
	l.dirty.Store(true)
	if l.since("", testInc, now, read); l.seq != before+1 {
		t.Fatal("an event did not make the log read the node again")
	}
}

// The negative control of the delta checks: a delta that drops one change
// (a partition, a member, a timeline group) no longer gives the status.
func TestStatusDeltaCheckCatchesDrop(t *testing.T) {
	f := newFakeStatus(3, 16)
	var l statusLog
	now := time.Unix(1000, 0)
	old := f.s
	first := l.since("", testInc, now, func() Status { return old })
	cur := old
	cur.Partitions = slices.Clone(old.Partitions)
	cur.Partitions[5].Holder, cur.Partitions[9].Epoch = "m3", 7
	cur.Members = slices.Clone(old.Members)
	cur.Members[1].Held = 99
	cur.Timeline = append(slices.Clone(old.Timeline), MoveGroup{Seq: 2, Causes: []Cause{}, Moves: []Move{}})
	d := l.since(first.Version, testInc, now.Add(statusScanEvery), func() Status { return cur })
	if got, err := old.Apply(d); err != nil || !sameStatus(got, cur) || d.Full {
		t.Fatalf("the whole delta does not give the status: %v", err)
	}
	for name, drop := range map[string]func(*StatusDelta){
		"a partition": func(d *StatusDelta) { d.Partitions = d.Partitions[1:] },
		"a member":    func(d *StatusDelta) { d.Members = nil },
		"a group":     func(d *StatusDelta) { d.Timeline = nil },
	} {
		bad := d
		drop(&bad)
		if got, err := old.Apply(bad); err == nil && sameStatus(got, cur) {
			t.Errorf("a delta without %s went unnoticed", name)
		}
	}
	bad := d
	bad.PartitionCount++
	if _, err := old.Apply(bad); err == nil {
		t.Error("a delta of another table applied")
	}
}

// wireGet fetches path from srv over a fresh connection and returns every
// byte of the response (status line, headers and body) and its body.
func wireGet(t *testing.T, srv *httptest.Server, path string) (int, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: tenure\r\nAccept: application/json\r\nConnection: close\r\n\r\n", path)
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %v", path, resp.Status, err)
	}
	return len(raw), body
}

func getDelta(t *testing.T, srv *httptest.Server, since string) (StatusDelta, int) {
	t.Helper()
	n, body := wireGet(t, srv, "/?format=json&since="+url.QueryEscape(since))
	var d StatusDelta
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	return d, n
}

// A real node's deltas over HTTP: after a crash, the delta applied to the
// page's old status is the node's status of the same version.
func TestStatusDeltaLive(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc := newTestCluster(t, nil)
	tc.startNodes(ctx, "d", 3)
	srv := httptest.NewServer(tc.node("d0").c.StatusHandler())
	defer srv.Close()
	old, _ := getDelta(t, srv, "")
	if !old.Full || len(old.Partitions) != testPartitions || len(old.Members) != 3 {
		t.Fatalf("first answer: full %v, %d partitions, %d members", old.Full, len(old.Partitions), len(old.Members))
	}
	tc.remove("d2").c.Close()
	tc.waitConverged(ctx)
	for {
		d, _ := getDelta(t, srv, old.Version)
		full, _ := getDelta(t, srv, "")
		if d.Version != full.Version { // the node changed between the two: again
			if ctx.Err() != nil {
				t.Fatal("the node's status never held still")
			}
			continue
		}
		got, err := old.Status.Apply(d)
		if d.Full || err != nil || !sameStatus(got, full.Status) || len(d.RemovedMembers) != 1 || len(d.Partitions) == 0 {
			t.Fatalf("delta (full %v, removed %v, %d partitions) applied: %v; matches %v", d.Full, d.RemovedMembers, len(d.Partitions), err, sameStatus(got, full.Status))
		}
		return
	}
}

// statusFigures prints what a refresh of a 4096-partition node's page
// transfers, whole and as a delta after one partition moved (response
// bytes on the wire, headers included).
func statusFigures(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const partitions = 4096
	fence, err := ownership.NewMemoryFence(partitions)
	if err != nil {
		t.Fatal(err)
	}
	tc := newTestCluster(t, func(c *Config) { c.Ring.Partitions, c.Fence, c.Handler = partitions, fence, HandlerFuncs{} })
	n := tc.start(ctx, "big0")
	if err := n.c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.c.StatusHandler())
	defer srv.Close()
	page, _ := wireGet(t, srv, "/?format=json")
	first, full := getDelta(t, srv, "")
	// One partition moves: a claim from elsewhere, as gossip brings it.
	const moved = 7
	cl := n.c.reg.GetClaim(moved)
	n.c.reg.Observe(ownership.Token{Partition: moved, Epoch: cl.Token.Epoch + 1, Owner: "elsewhere", Incarnation: 1})
	var d StatusDelta
	var refresh int
	for d.Version == "" || d.Version == first.Version {
		if ctx.Err() != nil {
			t.Fatal("the move never showed")
		}
		d, refresh = getDelta(t, srv, first.Version)
	}
	if d.Full || len(d.Partitions) != 1 || d.Partitions[0].Partition != moved {
		t.Fatalf("the delta after one move: full %v, partitions %+v", d.Full, d.Partitions)
	}
	fmt.Printf("figure: status.page_json_bytes_4096 %d\n", page)
	fmt.Printf("figure: status.full_refresh_bytes_4096 %d\n", full)
	fmt.Printf("figure: status.refresh_bytes_4096_one_move %d (target < 2048)\n", refresh)
}

// Whatever since a client sends (the page's query string), the node
// answers the whole status or a delta from a version it keeps, and never
// panics.
func FuzzStatusSince(f *testing.F) {
	for _, s := range []string{"", testInc + ".2", testInc + ".0", testInc + ".18446744073709551615", ".", testInc + ".-1", "x.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, since string) {
		var l statusLog
		fs := newFakeStatus(1, 8)
		now := time.Unix(1, 0)
		for range 4 {
			now = now.Add(statusScanEvery)
			l.since("", testInc, now, fs.step)
		}
		d := l.since(since, testInc, now, func() Status { return l.last })
		v, ok := parseVersion(since, testInc)
		if !d.Full && (!ok || v < l.base || v > l.seq || d.Since != since) {
			t.Fatalf("since %q: a delta from a version the log does not keep (%d..%d)", since, l.base, l.seq)
		}
	})
}

// StatusDelta's JSON is Status's plus the fields its doc comment lists,
// each under its documented name.
func TestStatusDeltaJSONMatchesItsDoc(t *testing.T) {
	keys := func(v any) map[string]bool {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for k := range m {
			out[k] = true
		}
		return out
	}
	base, delta := keys(Status{}), keys(StatusDelta{})
	src, err := os.ReadFile("status_delta.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(src[:bytes.Index(src, []byte("type StatusDelta struct"))])
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^//\t([a-z_]+) +(string|bool|number|\[\]string|\[\]object) `).FindAllStringSubmatch(doc, -1) {
		documented[m[1]] = true
	}
	for k := range delta {
		if !base[k] && !documented[k] {
			t.Errorf("the delta's field %s is not in StatusDelta's doc", k)
		}
	}
	for k := range documented {
		if !delta[k] {
			t.Errorf("StatusDelta's doc lists %s, the JSON has no such field", k)
		}
	}
	if len(documented) < 5 {
		t.Fatalf("read only %v from the doc", documented)
	}
}
