// Package netns builds test networks out of Linux network namespaces, so
// that a process-level test's faults cut real sockets: gossip, gRPC and a
// database alike, not only what a node chooses to drop.
//
// New makes one namespace per node, each with a veth into a bridge in a
// hub namespace, and a veth from the root namespace (the host, where the
// test runs and its clients dial from) into the same bridge, all on a
// private /24 no route of the root namespace overlaps. No namespace has a
// default route, nothing forwards or translates: traffic stays inside.
// Command runs a program in a node's namespace (ip netns exec); Do runs a
// function on a thread switched into it, so a socket it opens lives
// there; Relay makes a service on the host's loopback (PostgreSQL) a node
// of the network, so that a fault can cut it, and delays its traffic if
// asked (internal/netdelay's proxy).
//
// Faults are nftables rules inside the nodes' namespaces (a table inet
// tenure per node, rewritten in one transaction on each change):
// Partition cuts groups from each other both ways, Cut drops one
// direction, Loss drops a percentage of a node's incoming packets at
// random (numgen random mod 100 < p drop), Heal removes them all. The host
// is never cut.
//
// Close kills what still runs in the namespaces and removes them; New
// first sweeps namespaces a crashed run left (their names carry the pid
// of the process that made them). Building a Net needs root, iproute2's
// ip and Debian's nftables; without them New fails with a message that
// says which, never skips. The kernel here has no netem: delay goes
// through a Relay.
package netns
