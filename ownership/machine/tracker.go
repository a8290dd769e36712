package machine

import (
	"slices"

	"github.com/tenure-go/tenure/ownership/quorum"
)

// tracker decides whether a node sees enough of the cluster to keep its
// leases (L4), and keeps the stable membership it counts against. It is
// part of the Machine and runs on its logical clock.
//
// The stable membership changes in five ways, each to a version one above
// the highest known:
//
//   - bootstrap: the node that founds a cluster starts with itself;
//   - all fresh: when every member of an unchanged view (for StableAfter
//     ticks) has no stable membership yet, a new cluster forms from it;
//   - join: at once when the view holds all of it and every member new to
//     it is a new process (it shows no stable membership): a superset can't
//     be a minority of anything. A member that shows one comes back from
//     the far side of a split, and the view may still hold the members
//     lost to that split (not yet detected): it joins by promotion;
//     fresh joins are immediate so that a cluster that has just formed or
//     grown doesn't stall when an early member crashes; the price is that
//     a view taken while a split is still undetected can grow the set with
//     fresh members of both sides, and both sides may then count a quorum
//     until the split heals (the fence keeps that safe, L5 keeps it from
//     duelling; the simulator counts it);
//   - leave: at once when a member leaves gracefully: this node heard its
//     goodbye (View.Left), so it was not on the other side of a split. If
//     the view held a quorum just before, the stable set becomes the
//     members of both that view and the stable set, minus the leaver
//     (never a newcomer: a leave does not promote), which drops members
//     that crashed earlier too:
//     otherwise a crash followed by a graceful leave in a 3-node cluster
//     would leave the last node counting the crashed one. The view before,
//     not the one after: members lost in the same change may be on the far
//     side of a split that began as the leaver went. A member dropped
//     without a goodbye heard is a crash, even one that said it was
//     leaving: the far side of a split sees the leaver go too, and must
//     not count it as gone for good (issue 19, defect 4);
//   - promotion: when the view stayed unchanged for StableAfter and holds a
//     quorum of the stable set. A minority cut off from the rest loses sight
//     of the others one at a time; with StableAfter longer than that spread
//     it can never promote itself into a quorum.
//
// Quorum, promotion and join count only the members of the view this node
// reaches (ViewMember.Unreachable): a node cut off from the rest still
// shows them in its view until its own failure detector gives up on them.
//
// A heard stable membership with a higher ID replaces the node's own if it
// is at most MaxStableJump versions above and the node knows a quorum of
// its members (in its view or its own set). One of which it knows no
// quorum puts it in doubt (no quorum, no promotion) until StableAfter
// passes without hearing it again, and is adopted if the view grows to
// hold a quorum of it: a forged set of members that do not exist can't
// halt a node for good. A member whose metadata shows a higher ID than the
// node's (within MaxStableJump) makes it outdated (unless it is the node's
// own view at a higher version, which it takes: see nextShown): it has no
// quorum and asks one member that shows the newer ID for it (see toAsk; a
// member in step that steps ahead is asked a retry wait later, if this
// node has not heard the new set by then). This is
// what keeps a node that restarts on the minority side of a split, or that
// sat on the far side of a split that later reshaped, from counting a
// quorum the cluster no longer gives it.
type tracker struct {
	self        string
	bootstrap   bool
	min         int
	stableAfter uint64
	showEvery   uint64 // ShowTicks
	retry       uint64 // first wait before asking another member (toAsk)
	maxRetry    uint64 // longest wait between asks
	knobs       *TestingKnobs

	stable    quorum.Stable
	view      []string                   // members seen now, sorted, self included
	reached   []string                   // view minus the members that don't answer probes
	ids       map[string]quorum.StableID // stable ID each member of the view shows
	viewSince uint64                     // tick of the last change of view
	hasView   bool
	ok        bool
	outdated  bool
	doubt     bool                        // pending is known: no quorum, no promotion, but leaves still count
	asked     map[quorum.StableID]syncAsk // per newer stable ID the view shows: whom this node asked for it
	pending   quorum.Stable               // heard and newer, but no quorum of it is known
	showing   quorum.StableID             // the stable ID the node's metadata shows (ActShow)
	shownAt   uint64                      // tick of the last ActShow
	unshown   bool                        // stable changed since the last show
	pendingAt uint64                      // tick pending was last heard
	counted   struct {                    // reachedCount's last count
		members, reached []string
		n                int
	}
}

// A ViewMember is one member of a view of the membership, as gossip shows
// it.
type ViewMember struct {
	Name string
	// Incarnation is the member's current life, when known (0: unknown). A
	// claim held by an earlier life of a member is a dead holder's.
	Incarnation uint64
	// Stable is the ID of the stable membership the member holds (from its
	// metadata); zero if it has none yet or says nothing.
	Stable quorum.StableID
	// Leaving: the member is handing its partitions off before it leaves.
	// It is still a member (it counts for quorum and still serves what it
	// holds) but places no partitions.
	Leaving bool
	// Unreachable: the member is in the view but this node's own probes of
	// it fail (a node cut off from the rest keeps the others in its view
	// until it suspects them, which takes longer than their suspecting
	// it). It does not count for quorum; it is still a member. A node is
	// never unreachable to itself.
	Unreachable bool
}

// setView records a new view. left names members that left gracefully
// since the last view (their goodbye heard). It reports whether the stable membership changed.
func (q *tracker) setView(now uint64, members []ViewMember, left []string) bool {
	names := make([]string, 0, len(members))
	reached := make([]string, 0, len(members))
	ids := make(map[string]quorum.StableID, len(members))
	for _, m := range members {
		names = append(names, m.Name)
		if !m.Unreachable || m.Name == q.self {
			reached = append(reached, m.Name)
		}
		ids[m.Name] = m.Stable
	}
	slices.Sort(names)
	names = slices.Compact(names)
	slices.Sort(reached)
	reached = slices.Compact(reached)
	// The leave rule below asks whether the view held a quorum, not the
	// members this node reached: a member that missed a few pings under
	// load must not turn a leave into a shrink that keeps a crashed member
	// counted forever.
	wasOK := q.stable.Known() && !q.outdated && !q.doubt && q.count(q.view)
	prev := q.view
	if !q.hasView || !slices.Equal(names, q.view) || !slices.Equal(reached, q.reached) {
		q.viewSince = now
	}
	q.noteSteps(now, ids)
	q.view, q.reached, q.ids, q.hasView = names, reached, ids, true
	changed := false
	if q.min == 0 && q.stable.Known() && !q.outdated {
		for _, x := range left {
			if !q.stable.Has(x) || slices.Contains(names, x) {
				continue
			}
			if wasOK && slices.Contains(prev, x) {
				// The view before the leave, not the one after it: a
				// member lost in the same change of view may be on the
				// far side of a split that began as x left.
				// Members of the stable membership only: newcomers no
				// quorum promoted yet may be on the leaver's side of a
				// split that kept the old set's quorum on the other.
				rest := slices.DeleteFunc(slices.Clone(prev), func(m string) bool { return slices.Contains(left, m) || !q.stable.Has(m) })
				q.stable = quorum.NewStable(q.stable.Version+1, rest)
			} else {
				q.stable = quorum.NewStable(q.stable.Version+1, slices.DeleteFunc(slices.Clone(q.stable.Members), func(m string) bool { return m == x }))
			}
			changed = true
		}
	}
	if p := q.pending; p.Known() && quorum.Majority(p.Members, q.known()) {
		changed = q.heard(now, p) || changed
	}
	return q.eval(now) || changed
}

// heard merges a stable membership heard from another node and reports
// whether it replaced this node's.
func (q *tracker) heard(now uint64, s quorum.Stable) bool {
	if q.knobs != nil && q.knobs.StableFromFirstView {
		return false
	}
	if !s.Valid() || s.ID().Compare(q.stable.ID()) <= 0 || !quorum.Plausible(q.stable.ID(), s.ID()) {
		return false
	}
	if !quorum.Majority(s.Members, q.known()) {
		if s.ID().Compare(q.pending.ID()) >= 0 {
			q.pending, q.pendingAt = s, now
			q.eval(now)
		}
		return false
	}
	q.pending = quorum.Stable{}
	q.stable = s
	// The view must now stay unchanged for StableAfter before this node
	// promotes it over the set it just learned: otherwise two nodes whose
	// views differ (one wrongly holds a member dead) replace each other's
	// sets as fast as gossip carries them.
	q.viewSince = now
	q.eval(now)
	return true
}

// eval applies the rules above at tick now and reports whether the stable
// membership changed. It also updates ok and outdated.
func (q *tracker) eval(now uint64) bool {
	changed := false
	if q.knobs != nil && q.knobs.StableFromFirstView && !q.stable.Known() && q.hasView {
		// The defect this knob restores: a node trusts its own first view.
		q.stable, changed = quorum.NewStable(1, q.view), true
	}
	if !q.stable.Known() {
		switch {
		case q.bootstrap:
			q.stable, changed = quorum.NewStable(1, []string{q.self}), true
		case q.hasView && q.allFresh() && now-q.viewSince >= q.stableAfter:
			q.stable, changed = quorum.NewStable(1, q.view), true
		}
	}
	if q.pending.Known() && (q.pending.ID().Compare(q.stable.ID()) <= 0 || now-q.pendingAt > q.stableAfter) {
		q.pending = quorum.Stable{}
	}
	// A newer stable membership heard lately, of which no quorum is known,
	// puts this node in doubt until it expires (StableAfter after it was
	// last heard): it may be held by members this node can't see, or be
	// forged; adopted, a forged one (members that do not exist) would halt
	// the node for good. In doubt a node counts no quorum and promotes
	// nothing, like an outdated one, but still drops a member that leaves
	// gracefully: a leave lost while in doubt would be counted forever.
	q.doubt = q.pending.Known()
	if q.nextShown(now) {
		return true // heard re-ran eval on the set
	}
	q.outdated = false
	own := q.stable.ID()
	for _, m := range q.view {
		if id := q.ids[m]; id.Compare(own) > 0 && quorum.Plausible(own, id) && (q.knobs == nil || !q.knobs.StableFromFirstView) {
			q.outdated = true
		}
	}
	if q.stable.Known() && !q.outdated && !q.doubt && q.hasView && !slices.Equal(q.view, q.stable.Members) {
		switch {
		case quorum.Count(q.stable.Members, q.reached) == len(q.stable.Members) && q.newcomersFresh():
			q.stable, changed = quorum.NewStable(q.stable.Version+1, q.view), true
		case now-q.viewSince >= q.stableAfter && q.count(q.reached):
			q.stable, changed = quorum.NewStable(q.stable.Version+1, q.view), true
		}
	}
	switch {
	case q.min > 0:
		q.ok = len(q.reached) >= q.min
	default:
		q.ok = q.stable.Known() && !q.outdated && !q.doubt && q.count(q.reached)
	}
	return changed
}

// nextShown takes, as heard, the stable membership a member of the view
// shows when it is the one this node would promote next: its own view, at
// a higher version (within MaxStableJump). Usually one version up; more
// when the member showed a burst of changes as its latest (ShowTicks) or
// this node missed one. A join grows the set on every node that sees it;
// the first to promote shows the new ID in its metadata, and every node
// that saw the ID before the set's broadcast was outdated, without a
// quorum until the set reached it, although it held the set's every name:
// at 200 nodes in the simulator, 166 of 200 lost their quorum in one join
// and most stepped down, releasing and claiming again partitions the join
// never moved (issue 22). Only a node that reaches a majority of its own
// set takes it, from a member it reaches: the quorum it then counts is one
// it had, and the set is one it would promote itself (at once by the join
// rule, or once the view holds for StableAfter). A member's metadata
// outlives the member: taken from one cut off or crashed, with
// no quorum of the old set behind it, the set could give a minority a
// quorum (a helper's review). In doubt it takes nothing: heard would drop
// the doubt. The ID names the set by a hash of its names, as a
// broadcast's set is named. It reports whether the set was taken.
func (q *tracker) nextShown(now uint64) bool {
	if !q.stable.Known() || !q.hasView || q.doubt || slices.Equal(q.view, q.stable.Members) ||
		!q.count(q.reached) || q.knobs != nil && q.knobs.StableFromFirstView {
		return false
	}
	// The view is hashed (the cost, every tick while the view differs
	// from the set) only once a member shows a newer version. The hash
	// is of the names alone.
	var hash uint64
	for _, m := range q.reached {
		id := q.ids[m]
		if m == q.self || id.Version <= q.stable.Version || id.Version-q.stable.Version > quorum.MaxStableJump {
			continue
		}
		if hash == 0 {
			hash = quorum.NewStable(1, q.view).ID().Hash
		}
		if id.Hash == hash {
			return q.heard(now, quorum.NewStable(id.Version, q.view))
		}
	}
	return false
}

// state is what the quorum rests on (Machine.QuorumState).
func (q *tracker) state() QuorumState {
	return QuorumState{OK: q.ok, Min: q.min, Outdated: q.outdated, Doubt: q.doubt,
		Reached: q.reachedCount(), Stable: len(q.stable.Members), Members: len(q.reached)}
}

// reachedCount returns how many members of the stable membership the node
// reaches. The shell asks after every input (QuorumState): at 100 members
// counting each time was 3% of a node's CPU while a cluster started. It is
// counted again only when the stable membership or the reached members
// change; both are replaced, never written in place, so the slices
// themselves tell.
func (q *tracker) reachedCount() int {
	c := &q.counted
	if !sameSlice(c.members, q.stable.Members) || !sameSlice(c.reached, q.reached) {
		c.members, c.reached, c.n = q.stable.Members, q.reached, quorum.Count(q.stable.Members, q.reached)
	}
	return c.n
}

// sameSlice reports whether a and b are the same slice: the same length
// and, when not empty, the same first element.
func sameSlice(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// count reports whether seen holds a quorum of the stable membership.
func (q *tracker) count(seen []string) bool {
	if q.knobs != nil && q.knobs.HalfIsQuorum {
		return len(q.stable.Members) > 0 && 2*quorum.Count(seen, q.stable.Members) >= len(q.stable.Members)
	}
	if sameSlice(seen, q.reached) { // every tick: counted once per change
		return len(q.stable.Members) > 0 && 2*q.reachedCount() > len(q.stable.Members)
	}
	return quorum.Majority(q.stable.Members, seen)
}

// newcomersFresh reports whether every member of the view outside the
// stable membership is new to the cluster: it shows no stable membership
// (a process that just started). A member that shows one comes back from
// the far side of a split, where it may have learnt this node's; the view
// may still hold members this node lost to the same split (their failure
// not yet detected), so it joins by promotion only.
func (q *tracker) newcomersFresh() bool {
	for _, m := range q.view {
		if m != q.self && !q.stable.Has(m) && q.ids[m] != (quorum.StableID{}) {
			return false
		}
	}
	return true
}

// allFresh reports whether no member of the view holds a stable
// membership.
func (q *tracker) allFresh() bool {
	for _, m := range q.view {
		if q.ids[m] != (quorum.StableID{}) {
			return false
		}
	}
	return true
}

// known returns the members of the view and of the stable membership,
// sorted: the names this node has reason to believe exist.
func (q *tracker) known() []string {
	out := append(slices.Clone(q.view), q.stable.Members...)
	slices.Sort(out)
	return slices.Compact(out)
}

// A syncAsk is the last member asked for a newer stable membership, the
// tick it was asked at, and how many asks went before it for that ID; with
// node "", no one asked yet: a member in step with this node was seen to
// step to the ID at tick at (noteSteps).
type syncAsk struct {
	node  string
	at    uint64
	tries int
}

// toAsk returns the members to ask for their state now: for each stable
// ID above this node's that a member of the view shows, one member that
// shows it (issue 22: asking every such member made a membership change
// cost about n^2/10 full-state exchanges in a cluster of n). Another is
// asked only if this node has not reached that ID a retry wait after the
// last ask (RetryTicks, doubling with each ask for the same ID, at most
// MaxRetryTicks), or at once if the member asked left the view or no
// longer shows the ID: a member that is slow, dead but not yet detected,
// or whose state doesn't bring this node up to date (it doesn't know a
// quorum of the newer set) doesn't leave it outdated for good. The first
// member asked is picked by this node's name, so that the nodes that fall
// behind together don't all ask the same member; later asks go round the
// members that show the ID. One ask per ID and not one in all: a member
// may show a newer ID that can't bring this node up to date (forged, or
// one it can't adopt), and must not hold back the ask for another. An
// entry is forgotten once this node's stable membership reaches its ID or
// no member of the view shows it, so asked never holds more entries than
// the view has members.
//
// The one exception, a first ask that waits (noteSteps): a member in step
// with this node in the last view (inStep: it showed this node's own
// stable ID, or an older known one) steps past it. That is how a join
// looks from every member: the members that see the joiner promote the
// set and show it in their metadata (ActShow; a burst of joins as its
// latest, several versions at once), and the stable membership itself
// goes out by gossip as it changes (ActStable), which a node that knows a
// quorum of it adopts (heard) without asking anyone. Asked at once, about
// 0.85 n members of a cluster of n each synced with a whole-state
// push/pull per join (issue 22, item 4: 9 per join at 10 nodes, 17 at 20;
// at 15-20 nodes on a loaded machine their burst set off hundreds of false
// suspicions). So for such an ID the first ask waits one retry wait
// (RetryTicks, at least a tick) after the step was seen. A node that falls
// behind in any other way asks at once, as before: one that starts (no ID
// of its own); one for which a member new to the view, a fresh member (no
// ID yet) or one that showed another set of this node's version or a
// newer one shows the ID; one that saw a member step before and is still
// behind (the next step is from an ID newer than its own). Meanwhile the
// node is outdated all the same: the wait delays the ask, not the loss of
// its quorum.
func (q *tracker) toAsk(now uint64) []string {
	var names []string
	for _, a := range q.asks(now) {
		names = append(names, a.node)
	}
	return names
}

// asks is toAsk with each ask's tries: how many asks for the same stable
// membership went before it.
func (q *tracker) asks(now uint64) []syncAsk {
	own := q.stable.ID()
	for id := range q.asked {
		if id.Compare(own) <= 0 || !q.shown(id) {
			delete(q.asked, id)
		}
	}
	var out []syncAsk
	for _, m := range q.view {
		id := q.ids[m]
		if m == q.self || id.Compare(own) <= 0 || !quorum.Plausible(own, id) {
			continue
		}
		a, ok := q.asked[id]
		if ok && a.node == "" {
			if now-a.at < max(q.retry, 1) {
				continue // a member in step stepped to id: wait for its gossip
			}
			ok = false // the first ask
		}
		if ok && q.ids[a.node] == id && now-a.at < q.askWait(a.tries) {
			continue
		}
		next := syncAsk{node: q.pick(id, a.node, !ok), at: now}
		if ok {
			next.tries = a.tries + 1
		}
		if q.asked == nil {
			q.asked = make(map[quorum.StableID]syncAsk)
		}
		q.asked[id] = next
		out = append(out, next)
	}
	return out
}

// noteSteps records, from the view about to replace the last one (ids,
// each member's stable ID), the newer IDs whose first ask waits (see
// toAsk): an ID of a higher version than this node's own, first seen shown
// by a member in step with it in the last view (inStep). An ID first
// seen otherwise gets no entry and is asked for at once; a later step to
// an ID already seen changes nothing.
func (q *tracker) noteSteps(now uint64, ids map[string]quorum.StableID) {
	own := q.stable.ID()
	if own.Version == 0 {
		return
	}
	for m, id := range ids {
		if m == q.self || id.Compare(own) <= 0 || q.shown(id) {
			continue
		}
		if _, ok := q.asked[id]; ok {
			continue
		}
		if !inStep(q.ids[m], own) || id.Version <= own.Version { // a member new to the view shows no ID: not in step
			continue
		}
		// Another member may show id first seen otherwise in this same
		// view: then it is asked for at once.
		if q.otherwiseShown(id, ids) {
			continue
		}
		if q.asked == nil {
			q.asked = make(map[quorum.StableID]syncAsk)
		}
		q.asked[id] = syncAsk{at: now}
	}
}

// inStep reports whether a member that showed stable ID shown was in step
// with a node whose own is own: it showed own, or an older known version.
// A member shows a burst of changes as its latest (ShowTicks), so one in
// step with a node may step several versions past it at once, and one
// that just caught up may show a version it has already left. A fresh
// member (no ID) is not in step: what it shows first may come from the
// far side of a split.
func inStep(shown, own quorum.StableID) bool {
	return shown == own || shown.Version > 0 && shown.Version < own.Version
}

// otherwiseShown reports whether a member of the last view that was not in
// step with this node (inStep) shows id in ids (the new view's).
func (q *tracker) otherwiseShown(id quorum.StableID, ids map[string]quorum.StableID) bool {
	own := q.stable.ID()
	for m, mid := range ids {
		if m == q.self || mid != id {
			continue
		}
		if old, was := q.ids[m]; was && !inStep(old, own) {
			return true
		}
	}
	return false
}

// askWait is how long toAsk waits for an answer after the tries+1st ask
// for one stable ID before it asks again.
func (q *tracker) askWait(tries int) uint64 {
	base := max(q.retry, 1)
	limit := q.maxRetry
	if limit < base {
		limit = 32 * base
	}
	w := base
	for i := 0; i < tries && w < limit; i++ {
		w *= 2
	}
	return min(w, limit)
}

// shown reports whether a member of the view other than this node shows
// stable ID id.
func (q *tracker) shown(id quorum.StableID) bool {
	for m, mid := range q.ids {
		if m != q.self && mid == id {
			return true
		}
	}
	return false
}

// pick returns the member of the view to ask for stable ID id: the first
// time, one chosen by this node's name; then the next, in name order,
// after the member asked last.
func (q *tracker) pick(id quorum.StableID, last string, first bool) string {
	var shows []string
	for _, m := range q.view {
		if m != q.self && q.ids[m] == id {
			shows = append(shows, m)
		}
	}
	if first {
		h := uint64(14695981039346656037) // FNV-1a
		for i := 0; i < len(q.self); i++ {
			h = (h ^ uint64(q.self[i])) * 1099511628211
		}
		return shows[h%uint64(len(shows))]
	}
	i, found := slices.BinarySearch(shows, last)
	if found {
		i++
	}
	return shows[i%len(shows)]
}
