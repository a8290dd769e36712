package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A StatusDelta is what changed in a node's Status since an earlier
// version of it, so a page or a tool that polls a node of thousands of
// partitions transfers what moved, not the whole table (StatusSince; the
// status page's ?format=json&since=VERSION). Its JSON form is Status's,
// with these differences and additions:
//
//	version          string   this state's version: pass it as since next time
//	since            string   the version the delta starts from; "" when full
//	full             bool     the delta is a whole Status: replace, don't merge
//	                          (since was "", unknown, from another incarnation,
//	                          or older than the changes the node keeps)
//	stable           []string null when unchanged since since
//	unreachable      []string null when unchanged since since
//	members          []object the rows that changed or were added (all when full)
//	removed_members  []string members gone since since
//	partitions       []object the rows that changed (all when full)
//	timeline         []object the groups that changed or were added, by seq; a
//	                          group the client had comes with moves null (a
//	                          group's moves never change)
//	timeline_first   number   the seq of the oldest group the node keeps:
//	                          drop older ones
//
// The other fields (node, time, quorum, lag_ns, owned, ...) are always the
// current ones. Apply merges a delta into the Status it started from.
type StatusDelta struct {
	Status
	Version        string   `json:"version"`
	Since          string   `json:"since"`
	Full           bool     `json:"full"`
	RemovedMembers []string `json:"removed_members"`
	TimelineFirst  uint64   `json:"timeline_first"`
}

// statusScanEvery is how long StatusSince reuses its last reading of the
// node (by Config.Clock) when no event came since: many pollers share one
// scan of the table.
const statusScanEvery = 50 * time.Millisecond

// maxStatusChanges bounds the versions a node keeps deltas for; besides,
// the changes kept list at most about one full status's worth of rows. A
// client further behind gets a full status.
const maxStatusChanges = 256

// StatusSince returns what changed in Status since version, or the whole
// Status (Full) when since is "" or too old to answer with a delta. It
// reads the node's state at most once per 50 ms, or at once after an
// event, however many callers poll; the changes it keeps take memory in
// proportion to one Status.
func (c *Coordinator) StatusSince(since string) StatusDelta {
	return c.timeline.changes.since(since, hex16(c.self.Incarnation), c.cfg.Clock.Now(), c.Status)
}

// change is what one version changed: partitions by index, members by
// name, timeline groups by seq (added: new, or their moves changed).
type change struct {
	parts       []uint32
	members     []string
	groups      []uint64
	added       []uint64
	stable      bool
	unreachable bool
}

// size counts ch's rows, and one for the version itself.
func (ch change) size() int {
	return len(ch.parts) + len(ch.members) + len(ch.groups) + len(ch.added) + 1
}

func (ch change) empty() bool { return ch.size() == 1 && !ch.stable && !ch.unreachable }

// statusLog versions a node's Status: each reading that differs from the
// last in anything but its scalar fields is a new version, and the log
// keeps what each recent version changed.
type statusLog struct {
	dirty atomic.Bool // an event came: read the node again

	mu        sync.Mutex
	last      Status    // the latest reading
	scannedAt time.Time // when it was taken; zero: never
	seq       uint64    // its version
	base      uint64    // the oldest version a delta starts from: entries are base+1..seq
	entries   []change
	items     int // the total size of entries
}

// since answers StatusSince for a node of incarnation inc.
func (l *statusLog) since(since, inc string, now time.Time, read func() Status) StatusDelta {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dirty.Swap(false) || l.scannedAt.IsZero() || now.Before(l.scannedAt) || now.Sub(l.scannedAt) >= statusScanEvery {
		l.record(read())
		l.scannedAt = now
	}
	d := StatusDelta{Status: l.last, Version: inc + "." + strconv.FormatUint(l.seq, 10), RemovedMembers: []string{}}
	if len(l.last.Timeline) > 0 {
		d.TimelineFirst = l.last.Timeline[0].Seq
	}
	v, ok := parseVersion(since, inc)
	if !ok || v < l.base || v > l.seq {
		d.Full = true
		return d
	}
	d.Since = since
	var u change
	for _, e := range l.entries[v-l.base:] {
		u.parts = append(u.parts, e.parts...)
		u.members = append(u.members, e.members...)
		u.groups = append(u.groups, e.groups...)
		u.added = append(u.added, e.added...)
		u.stable = u.stable || e.stable
		u.unreachable = u.unreachable || e.unreachable
	}
	l.narrow(&d, u)
	return d
}

// narrow cuts d's lists down to what u changed.
func (l *statusLog) narrow(d *StatusDelta, u change) {
	if !u.stable {
		d.Stable = nil
	}
	if !u.unreachable {
		d.Unreachable = nil
	}
	slices.Sort(u.parts)
	d.Partitions = []PartitionStatus{}
	for _, p := range slices.Compact(u.parts) {
		d.Partitions = append(d.Partitions, l.last.Partitions[p])
	}
	changed := map[string]bool{}
	for _, name := range u.members {
		changed[name] = true
	}
	d.Members = []MemberStatus{}
	for _, m := range l.last.Members {
		if changed[m.Name] {
			d.Members = append(d.Members, m)
			delete(changed, m.Name)
		}
	}
	for name := range changed {
		d.RemovedMembers = append(d.RemovedMembers, name)
	}
	slices.Sort(d.RemovedMembers)
	d.Timeline = []MoveGroup{}
	for _, g := range l.last.Timeline {
		switch {
		case slices.Contains(u.added, g.Seq):
			d.Timeline = append(d.Timeline, g)
		case slices.Contains(u.groups, g.Seq):
			g.Moves = nil // the client has them
			d.Timeline = append(d.Timeline, g)
		}
	}
}

// parseVersion reads a version of incarnation inc.
func parseVersion(v, inc string) (uint64, bool) {
	head, seq, ok := strings.Cut(v, ".")
	if !ok || head != inc {
		return 0, false
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	return n, err == nil
}

// record makes s the latest reading, and a new version if it differs.
func (l *statusLog) record(s Status) {
	prev := l.last
	l.last = s
	if prev.PartitionCount != s.PartitionCount || prev.Started != s.Started || prev.Node != s.Node {
		// Another table: no delta spans it.
		l.seq++
		l.base, l.entries, l.items = l.seq, nil, 0
		return
	}
	ch := diffStatus(prev, s)
	if ch.empty() {
		return
	}
	l.seq++
	l.entries = append(l.entries, ch)
	l.items += ch.size()
	budget := len(s.Partitions) + len(s.Members) + maxGroups + 64
	for len(l.entries) > maxStatusChanges || (len(l.entries) > 0 && l.items > budget) {
		l.items -= l.entries[0].size()
		l.entries = slices.Delete(l.entries, 0, 1)
		l.base++
	}
}

// diffStatus lists what changed from a to b, two readings of one table.
func diffStatus(a, b Status) change {
	var ch change
	for i := range b.Partitions {
		if a.Partitions[i] != b.Partitions[i] {
			ch.parts = append(ch.parts, uint32(i))
		}
	}
	old := make(map[string]MemberStatus, len(a.Members))
	for _, m := range a.Members {
		old[m.Name] = m
	}
	for _, m := range b.Members {
		if o, ok := old[m.Name]; !ok || o != m {
			ch.members = append(ch.members, m.Name)
		}
		delete(old, m.Name)
	}
	for name := range old {
		ch.members = append(ch.members, name)
	}
	groups := make(map[uint64]MoveGroup, len(a.Timeline))
	for _, g := range a.Timeline {
		groups[g.Seq] = g
	}
	for _, g := range b.Timeline {
		o, ok := groups[g.Seq]
		switch {
		case !ok || !reflect.DeepEqual(o.Moves, g.Moves):
			ch.added = append(ch.added, g.Seq)
		case !reflect.DeepEqual(o, g):
			ch.groups = append(ch.groups, g.Seq)
		}
	}
	ch.stable = !slices.Equal(a.Stable, b.Stable)
	ch.unreachable = !slices.Equal(a.Unreachable, b.Unreachable)
	return ch
}

// ErrDeltaMismatch is Apply's error for a delta that does not start from
// the Status it is applied to.
var ErrDeltaMismatch = errors.New("coordinator: the delta does not start from this status")

// Apply returns s with d merged in: d itself (its Status) when d is full,
// else s's rows replaced, added and removed as d says. s must be the
// Status of version d.Since; a delta of another table is ErrDeltaMismatch.
func (s Status) Apply(d StatusDelta) (Status, error) {
	if d.Full {
		return d.Status, nil
	}
	if d.PartitionCount != s.PartitionCount {
		return s, fmt.Errorf("%w: %d partitions, the status has %d", ErrDeltaMismatch, d.PartitionCount, s.PartitionCount)
	}
	out := d.Status
	out.Stable, out.Unreachable = s.Stable, s.Unreachable
	if d.Stable != nil {
		out.Stable = d.Stable
	}
	if d.Unreachable != nil {
		out.Unreachable = d.Unreachable
	}
	out.Partitions = slices.Clone(s.Partitions)
	for _, p := range d.Partitions {
		if int(p.Partition) >= len(out.Partitions) {
			return s, fmt.Errorf("%w: partition %d of %d", ErrDeltaMismatch, p.Partition, len(out.Partitions))
		}
		out.Partitions[p.Partition] = p
	}
	members := map[string]MemberStatus{}
	for _, m := range s.Members {
		members[m.Name] = m
	}
	for _, m := range d.Members {
		members[m.Name] = m
	}
	for _, name := range d.RemovedMembers {
		delete(members, name)
	}
	out.Members = make([]MemberStatus, 0, len(members))
	for _, m := range members {
		out.Members = append(out.Members, m)
	}
	slices.SortFunc(out.Members, func(a, b MemberStatus) int { return strings.Compare(a.Name, b.Name) })
	groups := map[uint64]MoveGroup{}
	for _, g := range s.Timeline {
		if g.Seq >= d.TimelineFirst {
			groups[g.Seq] = g
		}
	}
	for _, g := range d.Timeline {
		if o, ok := groups[g.Seq]; ok && g.Moves == nil {
			g.Moves = o.Moves
		}
		groups[g.Seq] = g
	}
	out.Timeline = make([]MoveGroup, 0, len(groups))
	for _, g := range groups {
		out.Timeline = append(out.Timeline, g)
	}
	slices.SortFunc(out.Timeline, func(a, b MoveGroup) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}
