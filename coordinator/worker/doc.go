// Package worker runs a sharded consumer of a log on a coordinator: one
// worker goroutine per partition the node is granted, each calling the
// user's Func to process one batch at a time, what the Kinesis Client
// Library's record processor or a Kafka consumer group's rebalance
// listener does, with the consumer's own writes fenced.
//
// A Runtime is the coordinator's Handler. For each lease it:
//
//   - starts the worker after the coordinator fenced the lease's token and
//     after Config.Start (Handler.Acquire);
//   - calls Func in a loop; Func reads a batch from the partition's
//     committed offset and commits its effects and the new offset in one
//     fenced transaction (sqlfence.Offsets.Commit);
//   - backs off on a partition with nothing new (PollInterval doubling up
//     to MaxPollInterval, on the injected Clock);
//   - bounds the batches in progress across partitions (MaxConcurrent);
//   - on a planned release (a move, Resign, Leave) lets the batch in hand
//     commit, then stops: no commit is refused in a graceful handoff;
//   - on a lost lease cancels the batch in hand (its ctx ends) and stops;
//     a commit already on its way is refused by the fence;
//   - on a commit the fence refused (a stale token, a lost fence) reports
//     it to the coordinator (ReportStale), which ends the lease, and stops.
//
// The caller's duties, in order:
//
//  1. Keep the partition's offset and outputs in the database of the
//     fence (sqlfence.Fence as coordinator.Config.Fence, so every new
//     owner fences before it reads), and size that database's pool for
//     MaxConcurrent (sql.DB.SetMaxOpenConns and SetMaxIdleConns): with
//     database/sql's default of 2 idle connections, a goroutine per
//     partition opens and closes connections all the time (see
//     ownership/sqlfence's caller's duties).
//  2. New(Config{Process: ...}), set it as coordinator.Config.Handler,
//     coordinator.New, then Runtime.Bind(coordinator) before Start.
//  3. In Func, read the offset (sqlfence.Offsets.Get), read the events
//     from it, and commit through sqlfence.Offsets.Commit with
//     lease.Token(); return its error as it is. ErrOffsetMoved (an
//     earlier, in-doubt commit landed) and unknown outcomes are retried by
//     reading the offset again, never applied twice.
//  4. Leave the coordinator to hand off (each worker drains), or Close it
//     (a crash to the others); then Runtime.Close, which waits for every
//     worker: no goroutine outlives it.
//
// Effects outside the database (an e-mail, a call to another service) are
// not fenced: give each one an idempotency key made of the partition and
// the event's offset (not the epoch: a batch refused at commit is
// processed again by the next owner, in a new epoch).
//
// Check verifies, from the database, that every produced event was
// applied exactly once and in order per partition; ring.Partition is the
// partition function a producer that is not a member uses.
package worker
