// Package chaos proves tenure's safety promises (S1-S4, defined in package
// ownership's doc) the way Jepsen does: a real cluster runs a fenced
// workload while nemeses pause, partition, crash, restart and skew it,
// every operation at the protected resource is recorded with its token,
// start, end and outcome, and the history is checked with porcupine against
// a fenced-register model, beside direct invariant checks. A negative
// control runs the same schedule with the resource's fencing turned off and
// must be caught.
//
// The package is test machinery. Its exported pieces are the ones a check
// needs on both sides of a process boundary:
//
//   - SkewClock, a coordinator.Clock whose tickers run fast or slow and
//     whose time jumps;
//   - Record and History, the recorded operations;
//   - FencedRegisterModel, Operations and Check, the porcupine model of a
//     fenced register per partition (an Unknown outcome may or may not have
//     been applied) and the per-partition check that writes porcupine's
//     visualization to a file when a partition is not linearizable.
//
// The suite itself is in the package's tests:
//
//	go test -race -count=1 -run TestChaos -v ./internal/chaos/
//	go test -race -count=1 -run TestChaos -v ./internal/chaos/ -chaos.long          # minutes, more events
//	go test -race -count=1 -run TestChaos -v ./internal/chaos/ -chaos.seed=12345    # replay a logged seed
//
// TestChaosNetSplit (Linux, root) runs the SIGSTOP run's cluster on a
// real network instead: the child in a network namespace, the data in
// PostgreSQL, and the child isolated, its gossip and its database cut
// alike (internal/netns).
//
// TENURE_CHAOS_LONG=1 also selects the long run. Each run logs its seed
// and prints figure lines (chaos.nemesis_events, chaos.operations,
// chaos.stale_rejected, chaos.violations, and chaos.control_violations for
// the negative control).
package chaos
