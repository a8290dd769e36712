// Package leakcheck fails a test binary whose tests left goroutines
// running. It wraps go.uber.org/goleak, patiently: goroutines may take a
// moment to end after the Close that ends them, and a few of memberlist's
// outlive its Shutdown by a bounded time (see Upstream). It ignores no
// goroutine: every one must end, the upstream ones within Wait.Upstream and
// all others within Wait.Own.
//
// Call VerifyTestMain from a package's TestMain.
package leakcheck

import (
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/goleak"
)

// Upstream lists the functions of goroutines known to outlive a clean
// shutdown by a bounded time, in code that isn't ours. A goroutine whose
// stack holds one of them gets Wait.Upstream to end instead of Wait.Own;
// it is waited out, never ignored.
//
//   - memberlist's probeNode runs a probe round on its ticker's goroutine
//     and does not watch Shutdown: it waits for its acks, indirect acks and
//     TCP fallback until the round ends, ProbeInterval scaled by the
//     awareness multiplier (AwarenessMaxMultiplier, 8 by default).
//
// Not listed, because the coordinator's transport ends them at Shutdown
// (coordinator/conns.go): the round's TCP fallback (sendPingAndWaitForAck,
// whose dial or stream is cut), and handleConn, which serves a stream a
// peer opened (memberlist's Shutdown closes the listener, not the streams
// it accepted, so a silent peer would hold it until TCPTimeout).
var Upstream = []string{
	"github.com/hashicorp/memberlist.(*Memberlist).probeNode",
}

// Wait bounds how long Find waits for goroutines to end.
type Wait struct {
	// Own is how long any goroutine not listed in Upstream may take to
	// end: ours, the standard library's, gRPC's.
	Own time.Duration
	// Upstream is how long a goroutine listed in Upstream may take. It
	// covers memberlist's LAN preset (a probe round of 1 s, scaled up to 8
	// times) with room for a loaded machine.
	Upstream time.Duration
}

// Default is the wait VerifyTestMain and Find use.
func Default() Wait { return Wait{Own: 5 * time.Second, Upstream: 20 * time.Second} }

// Find returns an error listing the goroutines still running once w's
// bounds have passed, or nil as soon as none is left (other than the
// caller's and the testing package's).
func (w Wait) Find() error {
	start := time.Now()
	ignore := make([]goleak.Option, len(Upstream))
	for i, f := range Upstream {
		ignore[i] = goleak.IgnoreAnyFunction(f)
	}
	// First every goroutine but the upstream ones, within Own; then all of
	// them, within Upstream.
	if err := retry(start.Add(w.Own), ignore...); err != nil {
		return err
	}
	if err := retry(start.Add(max(w.Own, w.Upstream))); err != nil {
		return fmt.Errorf("upstream goroutines (%s) outlived %v: %w", strings.Join(Upstream, ", "), w.Upstream, err)
	}
	return nil
}

// retry runs goleak.Find (which itself retries for about 0.4 s) until it
// finds nothing or deadline has passed.
func retry(deadline time.Time, opts ...goleak.Option) error {
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// Find is Default().Find().
func Find() error { return Default().Find() }

// TestingM is what VerifyTestMain runs: a *testing.M, or a wrapper of one.
type TestingM interface{ Run() int }

// VerifyTestMain runs m's tests and then, if they passed, fails the run
// when Find finds goroutines left over. It exits the process.
func VerifyTestMain(m TestingM) {
	code := m.Run()
	if code == 0 {
		if err := Find(); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
