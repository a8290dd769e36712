package machine

import (
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tenure-go/tenure/internal/script"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/gossip"
	"github.com/tenure-go/tenure/ownership/quorum"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the script tests")

// Scripts under testdata/machine drive one Machine, a command per input;
// the output of each command is the actions it produced (Ready), one per
// line, or the answer of a query. The first command must be config.
//
//	config self=a:1 partitions=4 [grace= handoff= stepdown= stableafter= retry= maxretry=
//	       acquire= release= minquorum= maxclaims=] [bootstrap] [fenced] [strict] [knobs=a,b]
//	view members=a,b[:inc] owners=a,a,b,b|none [left=c] [leaving=b] [unreachable=b] [shows=b:2:a+b+c]
//	heard-stable v=2 members=a,b,c
//	tick [n]
//	heard p0 e1/b:2 [released]
//	claimed p0 e1/a:1 | claimed p0 err=conflict [current=e3/b:1|none] [partition=unset] | err=boom
//	fenced p0 e1/a:1 [stale=e2/b:1 | err=boom]
//	acquired p0 e1/a:1 [stale=e2/b:1 | err=boom]
//	rejected p0 e1/a:1 current=e2/b:1
//	notfenced p0 e1/a:1
//	resign p0 e1/a:1 [ended]
//	released p0 e1/a:1
//	leave
//	state p0        (prints the phase and token)
//	idle            (prints Machine.Idle)
//	quorum          (prints the quorum and the stable membership)
func TestMachineScripts(t *testing.T) {
	script.Run(t, "testdata/machine/*.txt", *rewrite, func(t *testing.T) func(script.Cmd) (string, error) {
		var m *Machine
		return func(c script.Cmd) (string, error) {
			if m == nil && c.Name != "config" {
				return "", errors.New("the first command must be config")
			}
			var (
				err    error
				answer string
			)
			m, answer, err = machineCommand(m, c)
			if err != nil {
				return "", err
			}
			var out []string
			if answer != "" {
				out = append(out, answer)
			}
			if q := queryMachine(m, c); q != "" {
				out = append(out, q)
			}
			for _, a := range m.Ready() {
				out = append(out, a.String())
			}
			return strings.Join(out, "\n"), nil
		}
	})
}

type scriptPlacement struct {
	owners  []string
	members []string
}

func (s *scriptPlacement) Partitions() int { return len(s.owners) }
func (s *scriptPlacement) Owner(p uint32) string {
	if int(p) >= len(s.owners) {
		return ""
	}
	return s.owners[p]
}
func (s *scriptPlacement) Fingerprint() uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, s.members, s.owners)
	return h.Sum64()
}

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// machineCommand feeds c to m; answer is what an input refused says.
func machineCommand(m *Machine, c script.Cmd) (_ *Machine, answer string, _ error) {
	atoi := func(k string) int {
		n, _ := strconv.Atoi(c.Args[k])
		return n
	}
	has := func(w string) bool { return slices.Contains(c.Pos, w) }
	switch c.Name {
	case "config":
		self, err := parseNode(c.Args["self"])
		if err != nil {
			return nil, "", err
		}
		knobs := &TestingKnobs{}
		for _, k := range list(c.Args["knobs"]) {
			switch k {
			case "skipfence":
				knobs.SkipFence = true
			case "firstview":
				knobs.StableFromFirstView = true
			case "nobackoff":
				knobs.NoClaimBackoff = true
			case "nostepdown":
				knobs.NoStepDown = true
			case "forgetview":
				knobs.ForgetFencedView = true
			case "half":
				knobs.HalfIsQuorum = true
			default:
				return nil, "", fmt.Errorf("unknown knob %q", k)
			}
		}
		nm, err := NewMachine(MachineConfig{Self: self, Partitions: atoi("partitions"),
			Bootstrap: has("bootstrap"), Fenced: has("fenced"), StrictAuthority: has("strict"),
			MinQuorum:  atoi("minquorum"),
			GraceTicks: atoi("grace"), HandoffTicks: atoi("handoff"),
			StepDownTicks: atoi("stepdown"), StableAfterTicks: atoi("stableafter"),
			RetryTicks: atoi("retry"), MaxRetryTicks: atoi("maxretry"),
			AcquireTicks: atoi("acquire"), ReleaseTicks: atoi("release"), MaxClaims: atoi("maxclaims"), Knobs: knobs})
		return nm, "", err
	case "view":
		v := View{Left: list(c.Args["left"])}
		shows := map[string]quorum.StableID{}
		for _, s := range strings.Fields(strings.ReplaceAll(c.Args["shows"], ";", " ")) {
			name, rest, _ := strings.Cut(s, ":")
			ver, members, _ := strings.Cut(rest, ":")
			n, err := strconv.ParseUint(ver, 10, 64)
			if err != nil {
				return m, "", fmt.Errorf("shows=%s: %v", s, err)
			}
			shows[name] = quorum.NewStable(n, strings.Split(members, "+")).ID()
		}
		leaving := list(c.Args["leaving"])
		unreachable := list(c.Args["unreachable"])
		members := list(c.Args["members"])
		for i, n := range members {
			// name:incarnation gives the member's life.
			name, inc, _ := strings.Cut(n, ":")
			members[i] = name
			life, _ := strconv.ParseUint(inc, 10, 64)
			v.Members = append(v.Members, ViewMember{Name: name, Incarnation: life, Stable: shows[name], Leaving: slices.Contains(leaving, name), Unreachable: slices.Contains(unreachable, name)})
		}
		if o := c.Args["owners"]; o != "none" {
			v.Placement = &scriptPlacement{members: members, owners: list(o)}
		}
		return m, "", m.SetView(v)
	case "heard-stable":
		n, _ := strconv.ParseUint(c.Args["v"], 10, 64)
		m.HeardStable(quorum.NewStable(n, list(c.Args["members"])))
	case "tick":
		n := 1
		if len(c.Pos) == 1 {
			n, _ = strconv.Atoi(c.Pos[0])
		}
		for range n {
			m.Tick()
		}
	case "leave":
		m.Leave()
	case "heard", "claimed", "fenced", "acquired", "rejected", "notfenced", "resign", "released":
		if len(c.Pos) < 1 {
			return m, "", errors.New("want a partition")
		}
		p, err := parsePartition(c.Pos[0])
		if err != nil {
			return m, "", err
		}
		var tok ownership.Token
		if len(c.Pos) >= 2 {
			if tok, err = parseToken(p, c.Pos[1]); err != nil {
				return m, "", err
			}
		}
		switch c.Name {
		case "heard":
			if _, err := m.Heard(gossip.Claim{Token: tok, Released: has("released")}); err != nil {
				answer = "refused: " + err.Error()
			}
		case "claimed":
			m.Claimed(p, tok, scriptErr(p, c.Args))
		case "fenced":
			m.Fenced(tok, scriptErr(p, c.Args))
		case "acquired":
			m.Acquired(tok, scriptErr(p, c.Args))
		case "rejected":
			cur, err := parseToken(p, c.Args["current"])
			if err != nil {
				return m, "", err
			}
			m.Rejected(tok, cur)
		case "notfenced":
			m.NotFenced(tok)
		case "resign":
			if err := m.Resign(tok, has("ended")); err != nil {
				answer = "refused: " + err.Error()
			}
		case "released":
			m.Released(tok)
		}
	case "state", "idle", "quorum":
	default:
		return m, "", fmt.Errorf("unknown command %q", c.Name)
	}
	return m, answer, nil
}

// queryMachine answers the query commands.
func queryMachine(m *Machine, c script.Cmd) string {
	switch c.Name {
	case "state":
		p, _ := parsePartition(c.Pos[0])
		ph, tok := m.Phase(p)
		s := ph.String()
		if !tok.IsZero() {
			s += " " + tokenShort(tok)
		}
		return s
	case "idle":
		return fmt.Sprint(m.Idle())
	case "quorum":
		return fmt.Sprintf("quorum=%v stable=%v", m.Quorum(), m.Stable())
	}
	return ""
}

func parsePartition(s string) (uint32, error) {
	p, err := strconv.ParseUint(strings.TrimPrefix(s, "p"), 10, 32)
	return uint32(p), err
}

func scriptErr(p uint32, args map[string]string) error {
	if s, ok := args["stale"]; ok {
		cur, err := parseToken(p, s)
		if err != nil {
			return err
		}
		return ownership.Stale(ownership.Token{}, cur)
	}
	switch args["err"] {
	case "":
		return nil
	case "conflict":
		if c, ok := args["current"]; ok {
			var cur ownership.Token
			if c != "none" {
				var err error
				if cur, err = parseToken(p, c); err != nil {
					return err
				}
			}
			if args["partition"] == "unset" { // an authority that leaves it zero
				return &ownership.ConflictError{Current: cur}
			}
			return &ownership.ConflictError{Partition: p, Current: cur}
		}
		return fmt.Errorf("script: %w", ownership.ErrConflict)
	default:
		return errors.New(args["err"])
	}
}

// parseNode parses "a:1".
func parseNode(s string) (ownership.Node, error) {
	name, inc, ok := strings.Cut(s, ":")
	n, err := strconv.ParseUint(inc, 10, 64)
	if !ok || err != nil || name == "" {
		return ownership.Node{}, fmt.Errorf("bad node %q, want name:incarnation", s)
	}
	return ownership.Node{Name: name, Incarnation: n}, nil
}

// parseToken parses "e3/a:1" for partition p.
func parseToken(p uint32, s string) (ownership.Token, error) {
	e, node, ok := strings.Cut(strings.TrimPrefix(s, "e"), "/")
	epoch, err := strconv.ParseUint(e, 10, 64)
	if !ok || err != nil {
		return ownership.Token{}, fmt.Errorf("bad token %q, want e<epoch>/<name>:<inc>", s)
	}
	n, err := parseNode(node)
	if err != nil {
		return ownership.Token{}, err
	}
	return ownership.Token{Partition: p, Epoch: epoch, Owner: n.Name, Incarnation: n.Incarnation}, nil
}
