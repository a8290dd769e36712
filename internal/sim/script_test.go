package sim

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/internal/script"
	"github.com/tenure-go/tenure/ownership/machine"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the script tests")

// Scripts under testdata drive a simulated cluster, a command per line;
// each command's output follows it. The first command is cluster.
//
//	cluster nodes=5 [partitions=8] [seed=1] [strict] [keys] [knobs=...] [bugs=...]
//	split n0,n1|n2,n3,n4      cut n0>n1      blind n0>n1 (n0 holds n1 dead)
//	crash n2   restart n2   pause n2 ticks=40   resume n2   leave n3
//	skew n1 fast|slow   outage ticks=20   reset   forge p3 [epoch=max]
//	resign n1 p3        (the handler gives partition p3 back)
//	heal                (every fault ends; crashed nodes restart)
//	run [ticks=N]       deliver (run long enough for messages in flight)
//	stabilize           (run until converged: prints how long, or the stall)
//	state               (who serves what, under which epoch; marks)
//	nodes               (each node's quorum and stable membership)
//	check               (the violations since the last check, or ok)
func TestScripts(t *testing.T) {
	script.Run(t, "testdata/*.txt", *rewrite, func(t *testing.T) func(script.Cmd) (string, error) {
		var (
			s    *Sim
			seen int
		)
		return func(c script.Cmd) (string, error) {
			if s == nil && c.Name != "cluster" {
				return "", errors.New("the first command must be cluster")
			}
			out, err := command(&s, c)
			if err != nil {
				return "", err
			}
			// Violations are printed as they happen, whatever the command.
			if v := s.Violations(); len(v) > seen && c.Name != "check" {
				out = strings.TrimRight(out+"\n"+"violation: "+strings.Join(v[seen:], "\nviolation: "), "\n")
				seen = len(v)
			} else if c.Name == "check" {
				seen = len(v)
			}
			return strings.TrimLeft(out, "\n"), nil
		}
	})
}

func command(sp **Sim, c script.Cmd) (string, error) {
	num := func(k string, def int) int {
		if v, ok := c.Args[k]; ok {
			n, err := strconv.Atoi(v)
			if err == nil {
				return n
			}
		}
		return def
	}
	has := func(w string) bool {
		for _, p := range c.Pos {
			if p == w {
				return true
			}
		}
		return false
	}
	if c.Name == "cluster" {
		cfg := DefaultConfig(uint64(num("seed", 1)))
		cfg.Nodes = num("nodes", 5)
		cfg.Partitions = num("partitions", 8)
		cfg.Strict, cfg.Keys = has("strict"), has("keys")
		for _, k := range list(c.Args["knobs"]) {
			switch k {
			case "firstview":
				cfg.Knobs.StableFromFirstView = true
			case "skipfence":
				cfg.Knobs.SkipFence = true
			default:
				return "", fmt.Errorf("unknown knob %q", k)
			}
		}
		for _, b := range list(c.Args["bugs"]) {
			switch b {
			case "trustgossip":
				cfg.Bugs.TrustGossip = true
			case "gracefulbyflag":
				cfg.Bugs.GracefulByFlag = true
			default:
				return "", fmt.Errorf("unknown bug %q", b)
			}
		}
		s, err := New(cfg)
		if err != nil {
			return "", err
		}
		*sp = s
		return fmt.Sprintf("formed after %d ticks", s.Settle()), nil
	}
	s := *sp
	idx := func(name string) (int, error) {
		if n := s.nodeByName(name); n != nil {
			return n.idx, nil
		}
		return 0, fmt.Errorf("no node %q", name)
	}
	group := func(g string) ([]int, error) {
		var out []int
		for _, name := range list(g) {
			i, err := idx(name)
			if err != nil {
				return nil, err
			}
			out = append(out, i)
		}
		return out, nil
	}
	first := func() (int, error) {
		if len(c.Pos) == 0 {
			return 0, errors.New("want a node")
		}
		return idx(c.Pos[0])
	}
	pair := func() (int, int, error) {
		if len(c.Pos) == 0 {
			return 0, 0, errors.New("want a>b")
		}
		a, b, _ := strings.Cut(c.Pos[0], ">")
		i, err := idx(a)
		if err != nil {
			return 0, 0, err
		}
		j, err := idx(b)
		return i, j, err
	}
	switch c.Name {
	case "split":
		if len(c.Pos) == 0 {
			return "", errors.New("want a|b")
		}
		l, r, _ := strings.Cut(c.Pos[0], "|")
		a, err := group(l)
		if err != nil {
			return "", err
		}
		b, err := group(r)
		if err != nil {
			return "", err
		}
		s.Split(a, b)
	case "cut":
		i, j, err := pair()
		if err != nil {
			return "", err
		}
		s.Cut(i, j)
	case "blind":
		i, j, err := pair()
		if err != nil {
			return "", err
		}
		s.net.blind[i][j] = true
		s.logFault("blind %s to %s", s.nodes[i].name, s.nodes[j].name)
	case "crash", "restart", "resume", "leave", "pause", "skew":
		i, err := first()
		if err != nil {
			return "", err
		}
		switch c.Name {
		case "crash":
			s.Crash(i)
		case "restart":
			s.Restart(i)
		case "resume":
			s.nodes[i].resume()
		case "leave":
			s.Leave(i)
		case "pause":
			s.Pause(i, num("ticks", 1<<30))
		case "skew":
			s.nodes[i].skew = map[bool]int{true: 1, false: -1}[has("fast")]
		}
	case "outage":
		s.Outage(num("ticks", 20))
	case "reset":
		s.Reset()
	case "forge":
		if len(c.Pos) == 0 {
			return "", errors.New("want a partition")
		}
		p, err := strconv.Atoi(strings.TrimPrefix(c.Pos[0], "p"))
		if err != nil {
			return "", err
		}
		e := uint64(math.MaxUint64)
		if v, ok := c.Args["epoch"]; ok && v != "max" {
			if e, err = strconv.ParseUint(v, 10, 64); err != nil {
				return "", err
			}
		}
		s.Forge(uint32(p), e)
	case "resign":
		i, err := first()
		if err != nil || len(c.Pos) < 2 {
			return "", fmt.Errorf("want a node and a partition: %v", err)
		}
		p, err := strconv.Atoi(strings.TrimPrefix(c.Pos[1], "p"))
		if err != nil {
			return "", err
		}
		n := s.nodes[i]
		if ph, t := n.m.Phase(uint32(p)); ph == machine.Owned {
			n.input(n.life, func() { n.m.Resign(t, false) })
		} else {
			return fmt.Sprintf("%s holds no lease on p%d", n.name, p), nil
		}
	case "heal":
		s.HealAll()
	case "run":
		s.Run(num("ticks", 1))
	case "deliver":
		s.Run(2*s.cfg.GossipDelay + 2)
	case "stabilize":
		took := s.Settle()
		if ok, _ := s.Converged(); ok {
			return fmt.Sprintf("converged after %d ticks", took), nil
		}
		return "", nil
	case "state":
		return s.stateString(), nil
	case "nodes":
		return s.nodesString(), nil
	case "check":
		v := s.Violations()
		if len(v) == 0 {
			return "ok", nil
		}
		return strings.Join(v, "\n"), nil
	default:
		return "", fmt.Errorf("unknown command %q", c.Name)
	}
	return "", nil
}

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// stateString lists, per node, the partitions it serves, and the
// resource's marks.
func (s *Sim) stateString() string {
	var b strings.Builder
	for _, n := range s.nodes {
		fmt.Fprintf(&b, "%s:", n.name)
		switch {
		case !n.up:
			b.WriteString(" down")
		case n.paused:
			b.WriteString(" paused,")
		}
		if n.up {
			for p, t := range n.servedTok {
				if !t.IsZero() {
					fmt.Fprintf(&b, " p%d@e%d", p, t.Epoch)
				}
			}
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "writes: %d applied, %d refused as stale, %d as not fenced\n", s.res.applied, s.res.stale, s.res.notFenced)
	b.WriteString("marks:")
	for p := range uint32(s.cfg.Partitions) {
		m := s.res.mark(p)
		fmt.Fprintf(&b, " p%d@e%d:%s", p, m.Epoch, m.Owner)
	}
	return b.String()
}

// nodesString gives each node's quorum and stable membership.
func (s *Sim) nodesString() string {
	var b strings.Builder
	for _, n := range s.nodes {
		if !n.up {
			fmt.Fprintf(&b, "%s: down\n", n.name)
			continue
		}
		fmt.Fprintf(&b, "%s: quorum=%v stable=%v\n", n.name, n.m.Quorum(), n.m.Stable())
	}
	return strings.TrimRight(b.String(), "\n")
}
