// Package consumer is a sharded consumer of an append-only log, built on
// tenure: the example to copy for "each partition of a log processed by
// one node, and no event's effect applied twice".
//
// The log is a table of events, each in the partition of its key (the
// ring.PartitionString). Every consumer process runs a Node: an embedded
// coordinator.Coordinator whose handler is a coordinator/worker Runtime,
// which runs a worker for each partition the node is granted (started
// after the fence, drained on a planned release, stopped on a lost lease
// or a stale commit). The worker reads a batch of
// events from the partition's committed offset, applies them to the
// outputs, and commits the outputs and the new offset in one fenced
// transaction (sqlfence, Exact mode) under the lease's token.
//
// Why nothing is applied twice: when a partition moves, the coordinator
// fences the database with the new owner's token before the new owner
// reads the committed offset. From then on a commit under the old token is
// rejected with ownership.ErrStaleToken, atomically with its writes: the
// old owner's batch, even one read and computed before the move and
// committed after it (a paused process, a slow network), changes nothing,
// and the new owner applies those events from the committed offset
// instead. The old owner drops the batch, reports the rejection to its
// coordinator (ReportStale), and stops consuming the partition. A planned
// move (a join, a graceful Leave) rejects nothing: Release lets the batch
// in hand commit first.
//
// What it relies on, in order:
//
//  1. The outputs, the offsets and the fence table are in one database,
//     so one transaction covers the check, the effect and the offset.
//     Effects outside that database (an e-mail, a call to another
//     service) are not fenced: give each event's effect an idempotency
//     key built from its partition and offset. Not the epoch: a batch
//     rejected at commit is read again by the next owner, in a new
//     epoch, and must be recognised as the same.
//  2. Every write to a partition's outputs and offset goes through
//     Store.Commit with the token of a live lease.
//  3. The store is fenced on every grant before the owner reads
//     (NewNode sets coordinator.Config.Fence to the store's fence).
//
// Store holds the SQL (SQLite or PostgreSQL; the program imports the
// driver), Node the consuming, and Verify the check that every event was
// applied exactly once. Options.BeforeCommit and Options.AfterCommit let a
// program act on each batch around its commit (an external effect before,
// metrics after) without touching the fenced path. The command
// `go run ./examples/consumer` runs this package in a self-checking
// scenario, in which ownership moves in the middle of a batch and the
// stale commit must be rejected.
package consumer
