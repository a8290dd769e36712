// Package slowtest scales tests' waits to how slow the machine is, and
// says so when a wait still times out.
//
// A convergence deadline that holds on an idle machine fails on a busy
// one: gossip, timers and the test's own polling all run late. The
// tests' waits take their deadlines from WithTimeout, which multiplies
// the idle-machine bound by Factor: the environment variable TENURE_SLOW
// if set (one documented factor, see coordinator/tenuretest/TESTING.md),
// else the machine's load measured when the wait begins (the 1-minute
// load average per CPU, at least 1, at most MaxFactor). A wait that
// still times out reports Describe: the load, the factor and how late
// the waiting loop itself ran (Lag), so a reader can tell an overloaded
// machine from a defect.
package slowtest
