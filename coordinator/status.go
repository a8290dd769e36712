package coordinator

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Status is a snapshot of what this node knows, for people and tools. Its
// JSON form (StatusHandler with ?format=json) uses these names, all
// snake_case; every one is always present (empty lists are []):
//
//	node              string   this node's name
//	incarnation       string   this process's incarnation, 16 hex digits
//	cluster           string   Config.ClusterName
//	time              string   when the snapshot was taken (RFC 3339)
//	started           bool     Start has run and a table exists
//	converged         bool     every partition is held by its ring owner, as this node sees it (see WaitConverged)
//	quorum            bool     this node sees a quorum of the stable membership (L4)
//	no_quorum         string   why quorum is false, "" while it is true: "not started";
//	                           "no stable membership yet..."; "outdated: ..." (a member shows
//	                           a newer stable membership); "in doubt: ..." (it heard a newer
//	                           one it knows no quorum of); "reaches R of the S stable members,
//	                           not a majority..."; or, with MinQuorum, "reaches N member(s),
//	                           fewer than MinQuorum (M)"
//	stable            []string the stable membership quorum is counted against; empty: none yet
//	stable_version    number   its version, 0 for none: higher is newer; a node that adopts a
//	                           newer set may skip versions, and two sides of a split can each
//	                           make a different set of one version
//	unreachable       []string members this node's own pings don't reach (three in a row, or
//	                           all while its pings say it reaches under half its view):
//	                           they are in its view but don't count for its quorum
//	unheard           []string members of the list this node took from a seed when it joined
//	                           that it has had no word from directly yet: for 2 x Grace
//	                           after its start they don't count for its quorum (a seed on
//	                           the minority side lists members it no longer reaches); sent
//	                           whole in every delta
//	lag_ns            number   the loop's lag: the largest delay, over the reach check's
//	                           span, between a tick firing and the loop running it (ns)
//	late              bool     lag_ns (over the span) is above half a ProbeTimeout: this node is too slow
//	                           to keep its promises (its reach check is suspended, so cut
//	                           off it may not end its leases before the others' Grace; it
//	                           steps down late by the lag)
//	leaving           bool     this node has started a graceful Leave
//	stale_rejections  number   writes under this node's leases a fence rejected (ReportStale)
//	partition_count   number   partitions of the key space (the ring's size)
//	owned             number   partitions this node holds a live lease on
//	members           []object the table's members, sorted by name (MemberStatus):
//	  name            string   member name
//	  gossip_addr     string   where it gossips (host:port)
//	  service_addr    string   its application endpoint, "" if it announced none
//	  incarnation     string   its incarnation, 16 hex digits
//	  self            bool     it is this node
//	  held            number   partitions whose latest claim it holds (not released)
//	  ring_share      number   partitions the ring assigns it
//	  fair_share      number   partition_count / number of members
//	partitions        []object one per partition, in order (PartitionStatus):
//	  partition       number   the partition
//	  owner           string   its ring owner: where placement puts it and Owner(key) routes
//	  holder          string   the node of the latest claim heard (token), "" if never claimed
//	  epoch           number   that claim's epoch
//	  released        bool     the holder gave it back and no one has claimed it since
//	  local           bool     this node holds a live lease on it
//	  state           string   "settled" (holder == owner), "moving" (released, or its
//	                           holder is no longer a member), "elsewhere" (held by a live
//	                           member other than the owner: a handoff waiting for the
//	                           holder's release), "unowned" (never claimed, or no owner)
//	timeline          []object recent changes of the table, newest last (MoveGroup):
//	  seq             number   the group's number: one more than the group before it
//	  time            string   when this node saw the change
//	  causes          []object the membership changes behind it (Cause):
//	    kind          string   "joined"; "left" (it had handed off every partition);
//	                           "failed" (it left the table still holding partitions:
//	                           a crash, a pause or a network cut); "leaving" (the
//	                           member began a Leave: it hands off before it goes)
//	    node          string   the member
//	    held          number   partitions a "failed" member still held
//	  moved           number   partitions whose ring owner changed
//	  moves           []object the moved partitions by old and new ring owner (Move):
//	    from          string   the old owner, "" for the first table
//	    to            string   the new owner
//	    partitions    []number the partitions
//	  pending         number   of the moved partitions, those not yet held by their new
//	                           owner (counted for the newest group only; 0 for older ones)
//	  superseded      bool     a later change came before this one settled
type Status struct {
	Node            string            `json:"node"`
	Incarnation     string            `json:"incarnation"`
	Cluster         string            `json:"cluster"`
	Time            time.Time         `json:"time"`
	Started         bool              `json:"started"`
	Converged       bool              `json:"converged"`
	Quorum          bool              `json:"quorum"`
	NoQuorum        string            `json:"no_quorum"`
	Stable          []string          `json:"stable"`
	StableVersion   uint64            `json:"stable_version"`
	Unreachable     []string          `json:"unreachable"`
	Unheard         []string          `json:"unheard"`
	Lag             time.Duration     `json:"lag_ns"`
	Late            bool              `json:"late"`
	Leaving         bool              `json:"leaving"`
	StaleRejections uint64            `json:"stale_rejections"`
	PartitionCount  int               `json:"partition_count"`
	Owned           int               `json:"owned"`
	Members         []MemberStatus    `json:"members"`
	Partitions      []PartitionStatus `json:"partitions"`
	Timeline        []MoveGroup       `json:"timeline"`
}

// MemberStatus is one member of the table with its share of partitions.
type MemberStatus struct {
	Name        string  `json:"name"`
	GossipAddr  string  `json:"gossip_addr"`
	ServiceAddr string  `json:"service_addr"`
	Incarnation string  `json:"incarnation"`
	Self        bool    `json:"self"`
	Held        int     `json:"held"`
	RingShare   int     `json:"ring_share"`
	FairShare   float64 `json:"fair_share"`
}

// PartitionStatus is one partition: where the ring puts it (Owner) and who
// holds it by the latest claim this node heard (Holder). They differ while
// a partition moves.
type PartitionStatus struct {
	Partition uint32 `json:"partition"`
	Owner     string `json:"owner"`
	Holder    string `json:"holder"`
	Epoch     uint64 `json:"epoch"`
	Released  bool   `json:"released"`
	Local     bool   `json:"local"`
	State     string `json:"state"`
}

// Partition states, as in PartitionStatus.State.
const (
	StateSettled   = "settled"
	StateMoving    = "moving"
	StateElsewhere = "elsewhere"
	StateUnowned   = "unowned"
)

func hex16(v uint64) string { return fmt.Sprintf("%016x", v) }

// Status returns a snapshot of this node's view.
func (c *Coordinator) Status() Status {
	// The loop's quorum snapshot, once it has one: the reason's counts are
	// of its stable set.
	stable, ok, why := *c.stable.Load(), false, "not started"
	if q := c.quorumNote.Load(); q != nil {
		stable, ok, why = q.stable, q.qs.OK, q.why
	}
	s := Status{
		Node:            c.self.Name,
		Incarnation:     hex16(c.self.Incarnation),
		Cluster:         c.cfg.ClusterName,
		Time:            c.cfg.Clock.Now(),
		Leaving:         c.leaving.Load(),
		StaleRejections: counterValue(c.metrics.staleRejections),
		Members:         []MemberStatus{},
		Partitions:      []PartitionStatus{},
		Quorum:          ok,
		NoQuorum:        why,
		Stable:          append([]string{}, stable.Members...),
		StableVersion:   stable.Version,
		Unreachable:     []string{},
		Unheard:         []string{},
		Lag:             time.Duration(c.lag.Load()),
	}
	s.Late = s.Lag > lagLimit(c.cfg)
	v := c.view.Load()
	if v != nil {
		s.Unreachable = append(s.Unreachable, v.unreachable...)
		s.Unheard = append(s.Unheard, v.unheard...)
	}
	if v == nil {
		s.Timeline = c.timeline.snapshot(c.reg)
		return s
	}
	t := v.table
	s.Started = true
	s.Converged = c.converged()
	s.PartitionCount = t.Partitions()
	held := make(map[string]int)
	for p := range uint32(t.Partitions()) {
		cl := c.reg.GetClaim(p)
		l := c.leases.lookup(p)
		ps := PartitionStatus{
			Partition: p, Owner: t.Owner(p), Holder: cl.Token.Owner, Epoch: cl.Token.Epoch,
			Released: cl.Released, Local: l != nil && l.Err() == nil,
		}
		switch {
		case ps.Owner == "" || (ps.Holder == "" && !ps.Released):
			ps.State = StateUnowned
		case ps.Released || !t.Has(ps.Holder):
			ps.State = StateMoving
		case ps.Holder != ps.Owner:
			ps.State = StateElsewhere
		default:
			ps.State = StateSettled
		}
		if ps.Local {
			s.Owned++
		}
		if !ps.Released && ps.Holder != "" {
			held[ps.Holder]++
		}
		s.Partitions = append(s.Partitions, ps)
	}
	names := t.Members()
	for _, name := range names {
		m := v.members[name]
		s.Members = append(s.Members, MemberStatus{
			Name: name, GossipAddr: m.GossipAddr, ServiceAddr: m.ServiceAddr,
			Incarnation: hex16(m.Incarnation), Self: name == c.self.Name,
			Held: held[name], RingShare: t.Share(name),
			FairShare: float64(t.Partitions()) / float64(len(names)),
		})
	}
	s.Timeline = c.timeline.snapshot(c.reg)
	return s
}

// counterValue reads a Prometheus counter.
func counterValue(c interface{ Write(*dto.Metric) error }) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}

// StatusHandler returns an http.Handler for the status page: HTML for
// browsers (a partition map, the members, the timeline of moves and the
// node's health, refreshed every second without a reload; it loads
// nothing from elsewhere, so it works offline), and JSON (Status) when the
// request has ?format=json or asks for application/json. With
// &since=VERSION the JSON is a StatusDelta, compact: what changed since
// that version (since= empty: the whole status and its version). The page
// loads the whole status once, then asks for deltas, so a refresh costs
// what changed, not the table's size.
func (c *Coordinator) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "tenure: the status page answers GET only", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		q := r.URL.Query()
		if q.Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			if q.Has("since") {
				_ = json.NewEncoder(w).Encode(c.StatusSince(q.Get("since")))
				return
			}
			enc := json.NewEncoder(w)
			enc.SetIndent("", " ")
			_ = enc.Encode(c.Status())
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
		_, _ = w.Write(statusPage)
	})
}

// statusPage is the page's HTML, CSS and script in one file: it fetches
// the JSON from its own URL.
//
//go:embed status_page.html
var statusPage []byte
