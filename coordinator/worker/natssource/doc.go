// Package natssource consumes a NATS JetStream stream with the
// coordinator/worker runtime: each partition of the coordinator's ring is
// one subject of the stream, each worker reads its partition's subject
// from the offset committed in the database, and applies a batch and
// moves the offset in one fenced transaction (sqlfence.Offsets.Commit),
// so each event is applied exactly once, whatever the broker redelivers.
//
// It is a module of its own
// (github.com/tenure-go/tenure/coordinator/worker/natssource), so that
// programs that don't use NATS don't get its client in their go.sum.
//
// # The partition's offset
//
// The offset is a JetStream stream sequence: the one after the last
// message applied (0 before the first). The database holds it, not the
// broker: the Source's consumers are ephemeral, without acks, created at
// the committed offset when a worker starts or after a failed commit, and
// deleted when it stops. A batch fetched twice (a commit whose answer was
// lost, a new owner reading what the former one fetched) moves the offset
// once: the second commit fails with sqlfence.ErrOffsetMoved and writes
// nothing, and the next fetch starts at the committed offset. Messages the
// server delivered but the Source never read (a fetch the client ended
// before they arrived) show as a jump in the consumer's delivery sequence:
// the fetch fails and the next one reads from the committed offset again
// (TestDeliveriesLostInTransitAreReadAgain).
//
// # The caller's duties, in order
//
//  1. Create a stream whose subjects cover Prefix+".*" (one subject per
//     partition: Subject(Prefix, p)). Producers publish an event with key
//     k to SubjectOf(Prefix, k, partitions), which uses
//     ring.PartitionString, the coordinator's partition function:
//     partitions must be the coordinator's Config.Partitions.
//  2. Open the database, size its pool for the workers
//     (worker.Config.MaxConcurrent: sql.DB.SetMaxOpenConns and
//     SetMaxIdleConns), create the fence's and the Offsets' tables.
//  3. New(Config{...}) with an Apply that writes through the tx it is
//     given only; set Source.Process as worker.Config.Process and
//     Source.Stop as worker.Config.Stop (or call it from yours); then the
//     worker package's duties (Bind, Start, Leave or Close, Runtime.Close).
//
// Messages are read in stream order per subject; the order across
// partitions is not kept, as in any sharded consumer.
package natssource
