package chaos

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tenure-go/tenure/ownership"
)

// Kind is what an operation did at the resource.
type Kind uint8

const (
	// Fence raises the partition's mark to the token (an owner acquiring).
	Fence Kind = iota + 1
	// Write stores a value under the token (Exact mode: token == mark).
	Write
	// Read returns the register under the token (Exact mode).
	Read
)

func (k Kind) String() string {
	switch k {
	case Fence:
		return "fence"
	case Write:
		return "write"
	case Read:
		return "read"
	}
	return "kind(?)"
}

// Outcome is what the caller learned.
type Outcome uint8

const (
	// OK: applied (a write or fence) or answered (a read).
	OK Outcome = iota + 1
	// Stale: refused, the token is below the mark.
	Stale
	// NotFenced: refused, the token is above the mark (Exact mode).
	NotFenced
	// Unknown: the caller never learned (an answer lost, an error from the
	// commit, a crash): it may or may not have been applied.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Stale:
		return "stale"
	case NotFenced:
		return "not-fenced"
	case Unknown:
		return "unknown"
	}
	return "outcome(?)"
}

// Record is one operation at the fenced resource, as its caller saw it:
// the token it carried, when it started and ended (nanoseconds of one
// clock shared by every recorder of a history) and what it learned.
type Record struct {
	Client int    `json:"client"` // a small number per caller, for the visualization
	Node   string `json:"node"`   // the node that made the call
	Kind   Kind   `json:"kind"`
	Token  ownership.Token
	Value  string  `json:"value"` // Write: the value written; Fence: what fenced, if not a Fence call (a claim)
	Out    Outcome `json:"out"`
	// OutToken and OutValue are what an OK read returned: the token of the
	// write that stored the value, and the value.
	OutToken ownership.Token
	OutValue string `json:"out_value"`
	Start    int64  `json:"start"`
	End      int64  `json:"end"`
}

// History collects records from many goroutines.
type History struct {
	mu   sync.Mutex
	recs []Record
	sink func(Record)
}

// NewHistory returns an empty history. sink, when not nil, is called with
// every record as it is added (a child process prints them).
func NewHistory(sink func(Record)) *History { return &History{sink: sink} }

// Now is the history's clock: wall-clock nanoseconds, comparable across
// the processes of one machine.
func Now() int64 { return time.Now().UnixNano() }

// Add appends r.
func (h *History) Add(r Record) {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	if h.sink != nil {
		h.sink(r)
	}
}

// Records returns a copy of the records so far.
func (h *History) Records() []Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

// regState is the model's state of one partition: the resource's mark and
// the register (the last value written and the token it was written
// under).
type regState struct {
	Mark  ownership.Token
	Token ownership.Token
	Value string
}

// judge is the fence rule for a token against the mark in Exact mode.
func judge(t, mark ownership.Token) Outcome {
	switch c := t.Compare(mark); {
	case t.IsZero() || c < 0:
		return Stale
	case c == 0:
		return OK
	default:
		return NotFenced
	}
}

// FencedRegisterModel is the porcupine model of a fenced register per
// partition (the history is partitioned by Token.Partition). Fence raises
// the mark; Write and Read in Exact mode succeed iff the token is the mark,
// are stale iff it is below, and not-fenced iff above. An operation with
// an Unknown outcome may have been applied or not: it is legal at any
// point, applied where the rule allows it, and since its return time is
// infinite the checker may also place it after everything else, which is
// the same as never.
func FencedRegisterModel() porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[uint32][]porcupine.Operation{}
			var keys []uint32
			for _, op := range h {
				p := op.Input.(Record).Token.Partition
				if _, ok := by[p]; !ok {
					keys = append(keys, p)
				}
				by[p] = append(by[p], op)
			}
			slices.Sort(keys)
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, p := range keys {
				out = append(out, by[p])
			}
			return out
		},
		Init: func() any { return regState{} },
		Step: func(state, input, _ any) (bool, any) {
			s, r := state.(regState), input.(Record)
			return step(s, r)
		},
		DescribeOperation: func(input, _ any) string {
			r := input.(Record)
			tok := fmt.Sprintf("e%d:%s/%04x", r.Token.Epoch, r.Token.Owner, r.Token.Incarnation&0xffff)
			switch r.Kind {
			case Write:
				return fmt.Sprintf("%s write(%s) %s -> %v", r.Node, tok, r.Value, r.Out)
			case Read:
				if r.Out == OK {
					return fmt.Sprintf("%s read(%s) -> %q@e%d", r.Node, tok, r.OutValue, r.OutToken.Epoch)
				}
				return fmt.Sprintf("%s read(%s) -> %v", r.Node, tok, r.Out)
			}
			if r.Value != "" {
				return fmt.Sprintf("%s fence(%s) by %s -> %v", r.Node, tok, r.Value, r.Out)
			}
			return fmt.Sprintf("%s fence(%s) -> %v", r.Node, tok, r.Out)
		},
		DescribeState: func(state any) string {
			s := state.(regState)
			return fmt.Sprintf("mark e%d:%s, %q@e%d:%s", s.Mark.Epoch, s.Mark.Owner, s.Value, s.Token.Epoch, s.Token.Owner)
		},
	}
}

func step(s regState, r Record) (bool, regState) {
	want := judge(r.Token, s.Mark)
	if r.Kind == Fence {
		if c := r.Token.Compare(s.Mark); c > 0 || (c == 0 && !r.Token.IsZero()) {
			want = OK
		}
	}
	if r.Out == Unknown {
		if want == OK {
			s = apply(s, r)
		}
		return true, s
	}
	if r.Out != want {
		return false, s
	}
	if want != OK {
		return true, s
	}
	if r.Kind == Read {
		return r.OutValue == s.Value && r.OutToken.Compare(s.Token) == 0, s
	}
	return true, apply(s, r)
}

func apply(s regState, r Record) regState {
	switch r.Kind {
	case Fence:
		if r.Token.Compare(s.Mark) > 0 {
			s.Mark = r.Token
		}
	case Write:
		s.Token, s.Value = r.Token, r.Value
	}
	return s
}

// Operations turns records into porcupine operations. An Unknown outcome
// gets an infinite return time.
func Operations(recs []Record) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(recs))
	for _, r := range recs {
		end := r.End
		if r.Out == Unknown {
			end = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: r, Output: r.Out, Call: r.Start, Return: end})
	}
	return ops
}

// CheckResult is the linearizability verdict on a history.
type CheckResult struct {
	Partitions int      // partitions checked
	Illegal    []uint32 // partitions whose history is not linearizable
	Undecided  []uint32 // partitions the checker gave up on (timeout)
	// Visualization is the path of porcupine's HTML visualization of the
	// illegal partitions, written when there are any.
	Visualization string
}

// Check checks recs against FencedRegisterModel, one partition at a time
// (each within timeout). When a partition is illegal it writes the
// visualization of the illegal partitions into dir and names it in the
// result.
func Check(recs []Record, timeout time.Duration, dir string) (CheckResult, error) {
	model := FencedRegisterModel()
	var res CheckResult
	var bad []porcupine.Operation
	for _, part := range model.Partition(Operations(recs)) {
		res.Partitions++
		p := part[0].Input.(Record).Token.Partition
		switch porcupine.CheckOperationsTimeout(model, part, timeout) {
		case porcupine.Illegal:
			res.Illegal = append(res.Illegal, p)
			bad = append(bad, part...)
		case porcupine.Unknown:
			res.Undecided = append(res.Undecided, p)
		}
	}
	if len(bad) == 0 {
		return res, nil
	}
	_, info := porcupine.CheckOperationsVerbose(model, bad, timeout)
	f, err := os.CreateTemp(dir, "chaos-porcupine-*.html")
	if err != nil {
		return res, err
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		return res, err
	}
	res.Visualization, _ = filepath.Abs(f.Name())
	return res, nil
}
