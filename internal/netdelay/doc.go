// Package netdelay is a TCP proxy on loopback (or on a listener of a test's
// own network namespace, Serve) that delays every byte by a fixed time in
// each direction, so that a benchmark against a local server
// can also be run as it would be across a network: the kernel here has no
// netem, and a test must talk to loopback only.
//
// A chunk read from one side is written to the other no earlier than
// Delay after it was read, in order; the proxy adds no delay of its own
// beyond that and the scheduling of its goroutines, which it shares with
// what it measures. It is for tests and figures, not production.
package netdelay
