// Package tenuretest lets the users of tenure test their own Handler and
// resource under the moves a real cluster makes: a handoff, a crash, a
// restart, a network partition and a pause.
//
// Start runs a cluster of real coordinators in the test process: real
// memberlist gossip over loopback, carried by a faultnet
// network so that Partition, Heal and Pause can cut it. Each node gets
// the Handler the test builds for it and the fence the test gives (a
// shared memory fence by default). Every method that waits takes a
// context and returns its error when the context ends first; Close ends
// every node and goroutine (the package's own tests check with goleak).
//
// The caller's duties, in order:
//
//  1. Start(ctx, Config{...}); defer Close().
//  2. Drive the cluster: Crash, Restart, Leave, Partition, Heal, Pause,
//     Resume; after each, WaitConverged (or, for one side of a partition,
//     WaitConverged with its node names) before asserting.
//  3. OwnerOf(ctx, key) names the node that holds the key's partition
//     once the live nodes agree on it; Node(name) is its coordinator.
//
// For unit tests without a cluster, Fake grants, moves and revokes leases
// directly, calling the Handler as a coordinator would.
package tenuretest
