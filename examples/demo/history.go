//go:build unix

package main

import (
	"fmt"
	"math"
	"time"

	"github.com/anishathalye/porcupine"
)

// op is one client call of the demo's history: a Put of a value or a Get
// that returned one. A Put whose answer never came (an error, a timeout)
// may or may not have been applied: it ends at infinity, so the checker
// may place it anywhere after its start, or never.
type op struct {
	key        int // the key's index in the run (writer*keys + i)
	put        bool
	value      uint64 // written, or read (0: not found)
	start, end int64  // nanoseconds since the run began
}

// unknownEnd is the end of a call whose outcome is unknown.
const unknownEnd = math.MaxInt64

// registerModel is a register per key: a Put sets it, a Get returns it.
// The demo's whole history must be linearizable for it, key by key, through
// every pause, crash, cut and handoff.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		var keys []int
		for _, o := range history {
			k := o.Input.(op).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		o := input.(op)
		if o.put {
			return true, o.value
		}
		return o.value == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		o := input.(op)
		if o.put {
			return fmt.Sprintf("put(k%d, %d)", o.key, o.value)
		}
		return fmt.Sprintf("get(k%d) -> %d", o.key, o.value)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state.(uint64)) },
}

// checkHistory checks the history with porcupine: Ok, Illegal, or Unknown
// if the check ran out of time. Unless Ok, it writes porcupine's
// visualization to path.
func checkHistory(history []op, path string) (porcupine.CheckResult, error) {
	ops := make([]porcupine.Operation, len(history))
	for i, o := range history {
		ops[i] = porcupine.Operation{ClientId: o.key, Input: o, Call: o.start, Return: o.end}
	}
	res, info := porcupine.CheckOperationsVerbose(registerModel, ops, time.Minute)
	if res == porcupine.Ok {
		return res, nil
	}
	return res, porcupine.VisualizePath(registerModel, info, path)
}
