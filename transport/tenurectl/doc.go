// Command tenurectl asks a tenure node, over its Ownership gRPC service
// (transport/ownershippb), what it knows: who owns a key, the partition
// map, the moves as they happen, and the node's health.
//
//	tenurectl -addr 127.0.0.1:9000 owner user-42 user-43   # who owns each key
//	tenurectl -addr 127.0.0.1:9000 map                     # partitions by owner (-rows: one row each)
//	tenurectl -addr 127.0.0.1:9000 watch -for 1m           # every move as it happens
//	tenurectl -addr 127.0.0.1:9000 status                  # health and members
//
// Output is a readable table; -json prints JSON for scripts instead (one
// object, or for watch one object per line), with the status page's
// snake_case names. The address defaults to $TENURE_ADDR. Every call is
// bounded by -timeout; watch runs until -for passes, -count moves were
// seen, the node ends the stream, or an interrupt.
//
// Exit status: 0 on success, 1 when the node could not answer (the error
// says why: unreachable, not a tenure node, no table yet), 2 on bad usage.
//
// Run it from the repository with go run ./transport/tenurectl.
package main
