package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
)

// A schedule is a run of episodes: faults for a while, then a heal, then
// a quiet spell in which the cluster must converge. Every fault the
// schedule applies is logged (Faults) in the vocabulary of the scripts, so
// a failing seed says what happened.

// settleBound is how long a healed cluster may take to converge: detection,
// stable membership, grace, handoff and handler timeouts, with room.
func (s *Sim) settleBound() int { return s.cfg.settleBoundOf() }

// settleBoundOf is settleBound of a cluster of c.
func (c Config) settleBoundOf() int {
	return 3*(c.DetectMax+c.JoinDelay) + 2*c.StableAfter + c.Grace + c.Handoff + 2*c.MaxRetry +
		c.Acquire + c.Release + 2*c.PushPull + 20 + c.scaleSlack()
}

// scaleSlack is the settle bound's room, in the scale mode, for a node
// that takes its share of the partitions MaxClaims at a time (a claim's
// round trip is at most 2 ticks, then its fence and Acquire).
func (c Config) scaleSlack() int {
	if !c.Scale {
		return 0
	}
	return 4 * c.claimRounds()
}

// maxEpochsPerHeal bounds the new epochs one partition may take between a
// heal and convergence: a move back, and under views still in flux a burst
// of concurrent claims by the nodes whose rings briefly gave it to them
// (5 seen in 6000 schedules of 7 nodes); more is a duel.
const maxEpochsPerHeal = 6

// Faults returns the faults applied so far, one per line.
func (s *Sim) Faults() []string { return s.faults }

func (s *Sim) logFault(format string, args ...any) {
	s.faultGen++
	line := fmt.Sprintf("t=%d ", s.now) + fmt.Sprintf(format, args...)
	s.faults = append(s.faults, line)
	s.tracef("fault: %s", line)
}

// Settle runs until the cluster has converged and stayed so while the
// messages of the heal drain (a claim given back after a view flapped may
// still be in flight and move a partition once more), or the bound passes;
// a stall is a violation, and so are too many epochs. It returns the ticks
// taken to converge.
func (s *Sim) Settle() int {
	start := s.now
	before := slices.Clone(s.chk.epochs)
	bound := s.settleBound()
	quiet := 2*s.cfg.GossipDelay + s.cfg.PushPull + 2
	var (
		why  string
		took = -1
		held = 0
	)
	for range bound + quiet {
		ok, w := s.Converged()
		switch {
		case !ok:
			why, held, took = w, 0, -1
		case took < 0:
			took, held = int(s.now-start), 1
		default:
			held++
		}
		if held >= quiet {
			break
		}
		if took < 0 && int(s.now-start) >= bound {
			break
		}
		s.Step()
	}
	if took < 0 || held < quiet {
		s.chk.fail("stall: not converged %d ticks after the heal: %s", bound, why)
		return int(s.now - start)
	}
	s.tracef("converged after %d ticks", took)
	s.chk.formed = true
	for p, e := range s.chk.epochs {
		if d := e - before[p]; d > maxEpochsPerHeal {
			s.chk.fail("duel: p%d took %d epochs to settle", p, d)
		}
	}
	s.chk.handlerContract()
	return took
}

// Steady runs n quiet ticks in which no partition may change hands.
func (s *Sim) Steady(n int) {
	before := slices.Clone(s.chk.epochs)
	s.Run(n)
	for p, e := range s.chk.epochs {
		if e != before[p] {
			s.chk.fail("churn: p%d took %d new epochs in a quiet, healthy cluster", p, e-before[p])
		}
	}
}

// HealAll ends every fault: links up, no drops, paused nodes resumed,
// clocks right, the resource back, crashed and departed nodes restarted.
func (s *Sim) HealAll() {
	s.healed = true
	s.logFault("heal")
	s.net.heal()
	s.res.outage = false
	for _, n := range s.nodes {
		n.resume()
		n.skew, n.lateUntil = 0, 0
		if !n.up {
			n.start(false)
		}
	}
}

// RunRandom runs a random schedule of episodes after the cluster formed.
func (s *Sim) RunRandom(episodes int) {
	s.Settle()
	s.Steady(10)
	for range episodes {
		if len(s.chk.violations) > 0 {
			return
		}
		s.episode()
	}
}

// fault kinds, drawn with these weights.
var faultKinds = []struct {
	name   string
	weight int
}{
	{"split", 6}, {"oneway", 3}, {"bridge", 2}, {"drops", 2}, {"crash", 4}, {"crash-restart", 4},
	{"pause", 5}, {"skew", 2}, {"leave", 2}, {"outage", 2}, {"reset", 1}, {"forge", 2}, {"reshape", 2},
	{"crash-minter", 2}, {"blind", 4}, {"replay", 2}, {"leave-split", 4}, {"leave-crash", 2},
	{"late", 4},
}

func (s *Sim) drawFault() string {
	total := 0
	for _, f := range faultKinds {
		total += f.weight
	}
	r := s.rng.IntN(total)
	for _, f := range faultKinds {
		if r < f.weight {
			return f.name
		}
		r -= f.weight
	}
	return "split"
}

// maxEpochsPerEpisode bounds the epochs one partition may take over an
// episode, faults and heal included: two nodes that both think they own a
// partition under split views must not fence each other in turn (L5).
const maxEpochsPerEpisode = 12

// episode applies one to three faults over a window, heals, and settles.
func (s *Sim) episode() {
	s.epoch++
	s.healed = false
	s.chk.newEpisode()
	before := slices.Clone(s.chk.epochs)
	defer func() {
		for p, e := range s.chk.epochs {
			d := e - before[p]
			s.MaxEpisodeEpochs = max(s.MaxEpisodeEpochs, d)
			if d > maxEpochsPerEpisode {
				s.chk.fail("duel: p%d took %d epochs in one episode", p, d)
			}
		}
	}()
	window := s.between(10, 120)
	for range s.between(1, 3) {
		kind := s.drawFault()
		at := s.between(0, window/2)
		s.after(at, func() { s.apply(kind, window-at) })
	}
	s.Run(window)
	s.HealAll()
	s.chk.crashMinter = false
	s.Settle()
	s.Steady(10)
}

// apply applies one fault kind, lasting about d ticks.
func (s *Sim) apply(kind string, d int) {
	n := len(s.nodes)
	pick := func() *node { return s.nodes[s.rng.IntN(n)] }
	downs := func() int {
		k := 0
		for _, x := range s.nodes {
			if !x.up {
				k++
			}
		}
		return k
	}
	switch kind {
	case "split":
		a, b := s.randomSplit()
		s.Split(a, b)
	case "oneway":
		i, j := s.rng.IntN(n), s.rng.IntN(n)
		if i != j {
			s.Cut(i, j)
		}
	case "bridge":
		a, b := s.randomSplit()
		bridge := b[0]
		s.Split(a, b[1:])
		s.logFault("bridge %s", s.nodes[bridge].name)
	case "drops":
		s.net.drop = 0.1 + 0.3*s.rng.Float64()
		s.logFault("drops %.2f", s.net.drop)
	case "crash":
		if x := pick(); x.up && 2*(downs()+1) < n {
			s.Crash(x.idx)
		}
	case "crash-restart":
		// A restart while the network may be split: the restarted node must
		// learn the cluster's stable membership before it claims.
		if x := pick(); x.up && 2*(downs()+1) < n {
			s.Crash(x.idx)
			s.during(s.between(1, max(1, d-1)), func() { s.Restart(x.idx) })
		}
	case "pause":
		if x := pick(); x.running() {
			s.Pause(x.idx, s.between(1, 3*s.cfg.Grace))
		}
	case "skew":
		if x := pick(); x.up {
			x.skew = []int{-1, 1}[s.rng.IntN(2)]
			s.logFault("skew %s %d", x.name, x.skew)
		}
	case "leave":
		if x := pick(); x.running() && 2*(downs()+1) < n {
			s.Leave(x.idx)
		}
	case "leave-split":
		// A split while a node hands off (issue 19, defect 4): one side
		// hears its goodbye, the other only sees it go.
		if x := pick(); x.running() && 2*(downs()+1) < n {
			s.Leave(x.idx)
			s.during(s.between(0, s.cfg.GossipDelay+2), func() {
				a, b := s.randomSplit()
				s.Split(a, b)
			})
		}
	case "leave-crash":
		// A crash while a node hands off, and the other way round.
		x, y := pick(), pick()
		if x != y && x.running() && y.up && 2*(downs()+2) < n {
			first, then := func() { s.Leave(x.idx) }, func() { s.Crash(y.idx) }
			if s.rng.IntN(2) == 0 {
				first, then = then, first
			}
			first()
			s.during(s.between(0, s.cfg.Handoff), then)
		}
	case "outage":
		s.Outage(s.between(1, 40))
	case "blind":
		i, j := s.rng.IntN(n), s.rng.IntN(n)
		if i != j {
			s.net.blind[i][j] = true
			s.logFault("blind %s to %s", s.nodes[i].name, s.nodes[j].name)
		}
	case "crash-minter":
		if 2*(downs()+1) < n {
			s.logFault("crash the next minter")
			s.chk.crashMinter = true
		}
	case "late":
		if x := pick(); x.running() {
			s.Late(x.idx, s.between(1, 3*s.cfg.Grace))
		}
	case "reset":
		s.Reset()
	case "forge":
		s.Forge(uint32(s.rng.IntN(s.cfg.Partitions)), math.MaxUint64-uint64(s.rng.IntN(3)))
	case "replay":
		s.Replay()
	case "reshape":
		// {A}|{B}, A a minority, held past StableAfter, then one node of B
		// crosses to A.
		a, b := s.randomSplit()
		if len(a) > len(b) {
			a, b = b, a
		}
		s.Split(a, b)
		hold := s.cfg.StableAfter + s.cfg.DetectMax + s.between(2, 10)
		s.during(hold, func() {
			if len(b) > 1 {
				s.Split(append(slices.Clone(a), b[0]), b[1:])
			}
		})
	}
}

// during runs fn d ticks from now unless the episode has ended by then.
func (s *Sim) during(d int, fn func()) {
	e := s.epoch
	s.after(d, func() {
		if s.epoch == e && !s.healed {
			fn()
		}
	})
}

// randomSplit draws two non-empty groups of nodes.
func (s *Sim) randomSplit() (a, b []int) {
	for len(a) == 0 || len(b) == 0 {
		a, b = nil, nil
		for i := range s.nodes {
			if s.rng.IntN(2) == 0 {
				a = append(a, i)
			} else {
				b = append(b, i)
			}
		}
	}
	return a, b
}

func (s *Sim) names(idx []int) string {
	var out []string
	for _, i := range idx {
		out = append(out, s.nodes[i].name)
	}
	return strings.Join(out, ",")
}

// Split cuts the network between groups a and b.
func (s *Sim) Split(a, b []int) {
	s.net.split(a, b)
	s.logFault("split %s|%s", s.names(a), s.names(b))
}

// Cut drops every packet from i to j.
func (s *Sim) Cut(i, j int) {
	s.net.link[i][j] = false
	s.logFault("cut %s>%s", s.nodes[i].name, s.nodes[j].name)
}

// Crash stops node i without a goodbye.
func (s *Sim) Crash(i int) {
	s.logFault("crash %s", s.nodes[i].name)
	s.nodes[i].crash()
}

// Restart starts node i again, with a new incarnation and nothing kept.
func (s *Sim) Restart(i int) {
	if s.nodes[i].up {
		return
	}
	s.logFault("restart %s", s.nodes[i].name)
	s.nodes[i].start(false)
}

// Pause stops node i from running for d ticks; what it had sent stays in
// flight, and writes it issued are held until it resumes.
func (s *Sim) Pause(i, d int) {
	n := s.nodes[i]
	if !n.running() {
		return
	}
	s.logFault("pause %s %d", n.name, d)
	n.paused = true
	life := n.life
	s.after(d, func() {
		if n.life == life {
			n.resume()
		}
	})
}

// Late makes node i's loop lag for d ticks: its ticks bunch, and its
// reach check sees the lag.
func (s *Sim) Late(i, d int) {
	n := s.nodes[i]
	s.logFault("late %s %d", n.name, d)
	n.lateUntil = s.now + uint64(d)
}

// Leave makes node i leave gracefully.
func (s *Sim) Leave(i int) {
	s.logFault("leave %s", s.nodes[i].name)
	s.nodes[i].leave()
}

// Outage makes the resource (and a strict authority) fail every call for
// d ticks.
func (s *Sim) Outage(d int) {
	s.logFault("outage %d", d)
	s.res.outage = true
	s.after(d, func() { s.res.outage = false })
}

// Reset loses the resource's marks, as a restore from a backup would.
func (s *Sim) Reset() {
	s.logFault("reset")
	s.res.reset()
}

// Forge has an adversary send every node a claim of p with epoch e, from
// a member that doesn't exist, unsigned, and the same claim under another
// cluster's name.
func (s *Sim) Forge(p uint32, e uint64) {
	s.logFault("forge p%d e%d", p, e)
	t := ownership.Token{Partition: p, Epoch: e, Owner: "evil", Incarnation: 1}
	for _, name := range []string{cluster, "other"} {
		b, err := gossip.Message{Kind: gossip.KindClaim, Cluster: name, Sender: "evil", Claim: gossip.Claim{Token: t}}.Seal(nil)
		if err != nil {
			panic(err)
		}
		for _, n := range s.nodes {
			life := n.life
			s.after(s.between(0, 2), func() { n.receive(life, gossip.Broadcast, b) })
		}
	}
}

// Replay has an adversary on the path send every node copies of messages
// the network carried (authentic, with keys), each on its own channel (a
// late duplicate) and on the other (a broadcast as push/pull state, a
// state as a broadcast), some at once and some later.
func (s *Sim) Replay() {
	sn := s.net.sniffed
	if len(sn) == 0 {
		return
	}
	s.logFault("replay %d messages", min(3, len(sn)))
	for range min(3, len(sn)) {
		m := sn[s.rng.IntN(len(sn))]
		for _, ch := range []gossip.Channel{gossip.Broadcast, gossip.PushPull} {
			for _, n := range s.nodes {
				life := n.life
				s.after(s.between(0, 2*s.cfg.PushPull), func() { n.receive(life, ch, m.msg) })
			}
		}
	}
}

// tickMillis is how long a tick lasts in the local preset's proportions
// (Grace 12 ticks, 2.5 s), for running a schedule in real time.
const tickMillis = 200

// ChaosScript turns faults (as Faults returns them) into a script for the
// real-time chaos suite (go test ./internal/chaos -run TestChaosScript
// -chaos.script=...): the steps it can run, with the time between them.
// Faults it has no step for are left out and named at the end.
func ChaosScript(faults []string) (script string, skipped []string) {
	var (
		eps  []string
		cur  []string
		last = -1
	)
	for _, f := range faults {
		var at int
		var rest string
		if _, err := fmt.Sscanf(f, "t=%d", &at); err != nil {
			continue
		}
		_, rest, _ = strings.Cut(f, " ")
		verb, _, _ := strings.Cut(rest, " ")
		if last >= 0 && at > last {
			cur = append(cur, fmt.Sprintf("wait %dms", (at-last)*tickMillis))
		}
		last = at
		switch verb {
		case "heal":
			if len(cur) > 0 {
				eps = append(eps, strings.Join(cur, "; "))
			}
			cur, last = nil, -1
		case "split", "cut", "crash", "restart", "drops":
			cur = append(cur, rest)
		default:
			skipped = append(skipped, rest)
		}
	}
	if len(cur) > 0 {
		eps = append(eps, strings.Join(cur, "; "))
	}
	return strings.Join(eps, " / "), skipped
}
