package ownership

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Scripts under testdata/machine drive one Machine with a line per input and
// list, on the lines starting with "> " that follow it, exactly the actions
// that input must produce (no "> " lines: no action). Lines starting with
// "#" are comments. The first line must be a config command.
//
//	config self=a:1 partitions=4 grace=2 handoff=0 stepdown=1 retry=0
//	placement members=a,b owners=a,a,b,b
//	quorum ok|lost
//	tick [n]
//	heard p0 e1/b:2 [released]
//	claimed p0 e1/a:1 | claimed p0 err=conflict [current=e3/b:1 [partition=unset]] | err=boom
//	acquired p0 e1/a:1 [stale=e2/b:1 | err=boom]
//	rejected p0 e1/a:1 current=e2/b:1
//	released p0 e1/a:1
//	leave
//	state p0 owned e1/a:1     (asserts the phase and token)
//	idle true|false           (asserts Machine.Idle)
func TestMachineScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/machine/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
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
func (s *scriptPlacement) Has(m string) bool { return slices.Contains(s.members, m) }
func (s *scriptPlacement) Fingerprint() uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, s.members, s.owners)
	return h.Sum64()
}

func runScript(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		m       *Machine
		lines   []string
		lineNos []int
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		lines = append(lines, strings.TrimSpace(sc.Text()))
		lineNos = append(lineNos, n)
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ">") {
			if strings.HasPrefix(line, ">") {
				t.Fatalf("%s:%d: expected action without an input before it", path, lineNos[i])
			}
			continue
		}
		var want []string
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], ">") {
			i++
			want = append(want, strings.TrimSpace(strings.TrimPrefix(lines[i], ">")))
		}
		where := fmt.Sprintf("%s:%d: %s", path, lineNos[i-len(want)], line)
		if m == nil && !strings.HasPrefix(line, "config ") {
			t.Fatalf("%s: first command must be config", where)
		}
		var err error
		m, err = applyCommand(m, line)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		var got []string
		for _, a := range m.Ready() {
			got = append(got, a.String())
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s\n got actions:\n  > %s\nwant actions:\n  > %s", where,
				strings.Join(got, "\n  > "), strings.Join(want, "\n  > "))
		}
	}
}

func applyCommand(m *Machine, line string) (*Machine, error) {
	f := strings.Fields(line)
	args := map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	atoi := func(k string) int {
		n, _ := strconv.Atoi(args[k])
		return n
	}
	switch f[0] {
	case "config":
		self, err := parseNode(args["self"])
		if err != nil {
			return nil, err
		}
		return NewMachine(MachineConfig{Self: self, Partitions: atoi("partitions"),
			GraceTicks: atoi("grace"), HandoffTicks: atoi("handoff"),
			StepDownTicks: atoi("stepdown"), RetryTicks: atoi("retry")})
	case "placement":
		return m, m.SetPlacement(&scriptPlacement{
			members: strings.Split(args["members"], ","),
			owners:  strings.Split(args["owners"], ","),
		})
	case "quorum":
		m.SetQuorum(len(pos) == 1 && pos[0] == "ok")
	case "tick":
		n := 1
		if len(pos) == 1 {
			n, _ = strconv.Atoi(pos[0])
		}
		for range n {
			m.Tick()
		}
	case "leave":
		m.Leave()
	case "heard", "claimed", "acquired", "rejected", "released", "state":
		if len(pos) < 1 {
			return m, errors.New("want a partition")
		}
		p64, err := strconv.ParseUint(strings.TrimPrefix(pos[0], "p"), 10, 32)
		if err != nil {
			return m, err
		}
		p := uint32(p64)
		var tok Token
		if len(pos) >= 2 && f[0] != "state" {
			if tok, err = parseToken(p, pos[1]); err != nil {
				return m, err
			}
		}
		switch f[0] {
		case "heard":
			m.Heard(Claim{Token: tok, Released: slices.Contains(pos, "released")})
		case "claimed":
			m.Claimed(p, tok, scriptErr(p, args))
		case "acquired":
			m.Acquired(tok, scriptErr(p, args))
		case "rejected":
			cur, err := parseToken(p, args["current"])
			if err != nil {
				return m, err
			}
			m.Rejected(tok, cur)
		case "released":
			m.Released(tok)
		case "state":
			ph, got := m.Phase(p)
			want := strings.Join(pos[1:], " ")
			have := ph.String()
			if ph != Unowned {
				have += " " + tokenShort(got)
			}
			if have != want {
				return m, fmt.Errorf("state p%d = %q, want %q", p, have, want)
			}
		}
	case "idle":
		if got := fmt.Sprint(m.Idle()); got != pos[0] {
			return m, fmt.Errorf("idle = %s, want %s", got, pos[0])
		}
	default:
		return m, fmt.Errorf("unknown command %q", f[0])
	}
	return m, nil
}

func scriptErr(p uint32, args map[string]string) error {
	if s, ok := args["stale"]; ok {
		cur, err := parseToken(p, s)
		if err != nil {
			return err
		}
		return Stale(Token{}, cur)
	}
	switch args["err"] {
	case "":
		return nil
	case "conflict":
		if c, ok := args["current"]; ok {
			cur, err := parseToken(p, c)
			if err != nil {
				return err
			}
			if args["partition"] == "unset" { // an authority that leaves it zero
				return &ConflictError{Current: cur}
			}
			return &ConflictError{Partition: p, Current: cur}
		}
		return fmt.Errorf("script: %w", ErrConflict)
	default:
		return errors.New(args["err"])
	}
}

// parseNode parses "a:1".
func parseNode(s string) (Node, error) {
	name, inc, ok := strings.Cut(s, ":")
	n, err := strconv.ParseUint(inc, 10, 64)
	if !ok || err != nil || name == "" {
		return Node{}, fmt.Errorf("bad node %q, want name:incarnation", s)
	}
	return Node{Name: name, Incarnation: n}, nil
}

// parseToken parses "e3/a:1" for partition p.
func parseToken(p uint32, s string) (Token, error) {
	e, node, ok := strings.Cut(strings.TrimPrefix(s, "e"), "/")
	epoch, err := strconv.ParseUint(e, 10, 64)
	if !ok || err != nil {
		return Token{}, fmt.Errorf("bad token %q, want e<epoch>/<name>:<inc>", s)
	}
	n, err := parseNode(node)
	if err != nil {
		return Token{}, err
	}
	return Token{Partition: p, Epoch: epoch, Owner: n.Name, Incarnation: n.Incarnation}, nil
}
