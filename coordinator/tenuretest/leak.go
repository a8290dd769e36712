package tenuretest

import "github.com/tenure-go/tenure/internal/leakcheck"

// TestingM is what VerifyTestMain runs: a *testing.M, or a wrapper of
// one.
type TestingM = leakcheck.TestingM

// VerifyTestMain runs m's tests and then fails the run if goroutines are
// left over, as goleak.VerifyTestMain does, but patiently and ignoring
// none: every goroutine must end within 5 s of the tests' end, and
// memberlist's prober, which outlives its Shutdown by up to a probe round,
// within 20 s. Call it from TestMain.
func VerifyTestMain(m TestingM) { leakcheck.VerifyTestMain(m) }
