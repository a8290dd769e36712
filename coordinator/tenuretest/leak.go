package tenuretest

import (
	"fmt"
	"os"

	"go.uber.org/goleak"
)

// TestingM is what VerifyTestMain runs: a *testing.M, or a wrapper of
// one.
type TestingM interface{ Run() int }

// VerifyTestMain runs m's tests and then fails the run if goroutines are
// left over, as goleak.VerifyTestMain does, but patiently: memberlist's
// probe goroutines outlive its Shutdown by up to a probe round (longer
// for a node whose peer was cut off), so the check is retried for several
// seconds before it fails. Call it from TestMain.
func VerifyTestMain(m TestingM) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for i := 0; err != nil && i < 8; i++ {
			err = goleak.Find() // each Find retries for about a second
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
