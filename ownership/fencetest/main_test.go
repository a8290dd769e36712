package fencetest_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSuiteFindsDefects is the suite's negative control: run against the
// example store with one defect each (in a test binary of its own, which
// must fail), the suite fails, in the tests named. The concurrent writers'
// tests catch stale writes only when the race interleaves them, so each
// named test must fail in one of up to defectTries runs (one CI run saw
// ConcurrentWriters/exact pass a stale-writes store: 209 writes applied,
// 31 refused, none of them out of order).
func TestSuiteFindsDefects(t *testing.T) {
	if defect := os.Getenv("FENCETEST_DEFECT"); defect != "" {
		fencetest.Run(t, fencetest.Config{
			New: func(t testing.TB) fencetest.Subject { return broken(nil, defect) },
			NewKeyed: func(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
				return broken(keys, defect)
			},
		})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for defect, caught := range map[string][]string{
		"stale-writes": {"Exact", "ConcurrentWriters/exact", "ConcurrentWriters/monotonic"},
		"fence-falls":  {"Advance", "ConcurrentFences"},
		"unsigned":     {"SignedStaleAnswers"},
	} {
		missing := slices.Clone(caught)
		var out []byte
		for try := 0; try < defectTries && len(missing) > 0; try++ {
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSuiteFindsDefects$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "FENCETEST_DEFECT="+defect)
			var err error
			out, err = cmd.CombinedOutput()
			if err == nil {
				t.Errorf("the suite passed a store whose defect is %s:\n%s", defect, out)
				missing = nil
				break
			}
			missing = slices.DeleteFunc(missing, func(name string) bool {
				return strings.Contains(string(out), "--- FAIL: TestSuiteFindsDefects/"+name+" ")
			})
		}
		for _, name := range missing {
			t.Errorf("defect %s: the suite's %s test did not fail in %d runs; the last:\n%s", defect, name, defectTries, out)
		}
	}
}

// defectTries bounds the runs of the suite against one defect.
const defectTries = 3

// broken returns the example store with defect.
func broken(keys *ownership.Keyring, defect string) fencetest.Subject {
	s := newStore(keys)
	s.broken = defect
	return s.subject()
}
