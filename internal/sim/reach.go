package sim

import (
	"slices"
	"time"

	"github.com/tenure-go/tenure/internal/reach"
)

// The reach check, modelled by the coordinator's own policy
// (internal/reach): every tick (a ProbeInterval) each running node feeds
// its check the lag of its loop, reads the answers of the round it sent a
// tick ago, starts the round the policy asks for, and marks Unreachable in
// its view the members the policy counts unreachable. A ping is answered
// if i and j can talk both ways, j runs, i is not blind to j, and i is not
// late (a late node can't wait for an answer). The model runs the check
// always, as if memberlist always reported trouble: every node pays the
// most it can.
//
// A late node (the "late" fault) is one whose loop lags: its machine's
// ticks bunch (none, then two), and every tick it runs a tick late. A
// paused node lags by the length of its pause when it resumes.

// tickDur is a tick in the policy's time, the local preset's
// ProbeInterval.
const tickDur = tickMillis * time.Millisecond

// simTime is tick t in the policy's time.
func simTime(t uint64) time.Time { return time.Unix(0, 0).Add(time.Duration(t) * tickDur) }

// reachConfig is the policy's timing in the sim's proportions: a round a
// tick, answers within half a tick, late above a quarter of a tick lag.
func (s *Sim) reachConfig() reach.Config {
	c := s.cfg
	return reach.Config{
		Interval: tickDur, Timeout: tickDur / 2, LagLimit: tickDur / 4,
		Span: time.Duration(c.ReachSpan) * tickDur, Hold: time.Duration(c.ReachHold) * tickDur, Misses: min(3, c.ReachSpan),
		PingAll: c.Bugs.ReachAllMembers, IgnoreLag: c.Bugs.ReachAllMembers || c.Bugs.ReachIgnoresLag,
	}
}

// reachRound is a round of pings in flight: its answers, read at due.
type reachRound struct {
	start   time.Time
	due     uint64
	answers map[string]bool
}

// pingable reports whether a ping from i could reach j and come back.
func (nw *network) pingable(i, j int) bool {
	return nw.bidi(i, j) && nw.answers(i) && nw.answers(j) && !nw.blind[i][j]
}

// late reports whether node i's loop lags now.
func (n *node) late() bool { return n.lateUntil > n.s.now }

// stepReach runs every node's reach check one tick.
func (nw *network) stepReach() {
	s := nw.s
	limit := s.reachConfig().LagLimit
	for i, n := range s.nodes {
		for j := range s.nodes {
			if i != j && !nw.pingable(i, j) {
				nw.unpingable[i][j] = s.now
			}
		}
		if !n.running() {
			continue
		}
		now := simTime(s.now)
		lag := reach.TickLag(n.ranAt, now, now, tickDur)
		if n.late() {
			lag = max(lag, tickDur)
		}
		n.rc.Lagged(now, lag)
		n.ranAt = now
		var members []reach.Member
		for j, m := range s.nodes {
			if j != i && nw.sees[i][j] {
				members = append(members, reach.Member{Name: m.name, Incarnation: m.self.Incarnation})
			}
		}
		if r := n.round; r != nil && r.due <= s.now {
			// The answers came within Timeout; the loop read them then,
			// or a tick later if it lags.
			n.round = nil
			read := r.start.Add(tickDur / 2)
			if n.late() {
				read = now
			}
			n.rc.Done(r.start, read, r.answers, members)
		}
		if due := n.rc.Due(now, true, members); len(due) > 0 {
			s.chk.pinged(n, len(due), len(members)+1, lag > limit)
			if s.scale != nil {
				s.scale.cost.ReachPings += uint64(len(due))
			}
			r := &reachRound{start: now, due: s.now + 1, answers: make(map[string]bool, len(due))}
			for _, m := range due {
				r.answers[m.Name] = nw.pingable(i, s.nodeByName(m.Name).idx) && !n.late()
			}
			n.round = r
		}
		un := n.rc.Unreachable(now, true, members)
		for j, m := range s.nodes {
			want := slices.Contains(un, m.name)
			if want == nw.unreach[i][j] {
				continue
			}
			nw.unreach[i][j] = want
			s.tracef("%s counts %s unreachable: %v", n.name, m.name, want)
			if nw.sees[i][j] {
				nw.dirty[i] = true
			}
			if want {
				s.chk.marked(n, un)
			}
		}
	}
}
