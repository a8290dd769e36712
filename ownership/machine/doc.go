// Package machine is tenure's per-node lease state machine: Machine, pure
// and deterministic, with no goroutine, clock or socket. A shell (package
// coordinator; the simulator in internal/sim) feeds it what happened (a
// view of the membership, claims and stable memberships heard from gossip,
// the answers of the authority, the fence and the handler, logical ticks)
// and performs the Actions Ready returns, in order.
//
// It decides everything: quorum and the stable membership (the tracker, on
// the rules of package ownership/quorum), when to claim, fence, acquire,
// serve and release, handoff against failover, and the deadlines of handler
// calls, and whether a resignation is allowed. It keeps the record of
// claims (MachineConfig.Register, the register gossip's push/pull carries):
// Heard says whether a claim is new, so the shell passes on only those.
// BuildView is the one function that turns a shell's report of the members
// into a View; the coordinator and the simulator both call it.
//
// ownership/DECISIONS.md explains each decision; the promises it
// keeps (S1-S4, L1-L5) are defined in package ownership's documentation.
//
// Script tests of one machine live in testdata/machine (TestMachineScripts).
package machine
