package tenuretest

import "github.com/tenure-go/tenure/internal/leakcheck"

// TestingM is what VerifyTestMain runs: a *testing.M, or a wrapper of
// one.
type TestingM = leakcheck.TestingM

// VerifyTestMain runs m's tests and then fails the run if goroutines are
// left over, as goleak.VerifyTestMain does, but patiently and ignoring
// none: every goroutine must end within 5 s of the tests' end, and the few
// of memberlist's that outlive its Shutdown by a bounded time (a probe
// round in flight; a stream a silent peer opened, until TCPTimeout) within
// 20 s. Call it from TestMain.
func VerifyTestMain(m TestingM) { leakcheck.VerifyTestMain(m) }
