// Command lockrace puts partition ownership with fencing tokens beside the
// per-key locks teams reach for, on the same store (PostgreSQL) and the
// same workload, and shows both sides of the trade: speed and safety.
//
//	go run -C examples/lockrace .     # needs PostgreSQL, Redis and etcd on loopback
//
// Five guards protect a read-modify-write of a counter (read the value,
// write it plus one):
//
//   - unguarded: the transaction alone, the ceiling (and it loses updates
//     under contention);
//   - tenure: the key's partition owner's fenced transaction
//     (sqlfence.Fence.DoConn, Exact, on a Concurrent fence), the token
//     checked in the database; the owner's clients, all in its process,
//     take turns on a key under a mutex in its memory;
//   - advisory: pg_advisory_xact_lock on the key in the same transaction;
//   - redsync: a Redis lock per key (github.com/go-redsync/redsync/v4)
//     held around the transaction;
//   - etcd-mutex: an etcd concurrency.Mutex per key held around the
//     transaction.
//
// First, throughput: several clients write, a share of their writes to a
// few hot keys, for the same time under each guard, in rounds that rotate
// the order. It prints operations per second, p50 and p99 latency, the
// ratio to unguarded, and the updates lost (the counters' sum against the
// acknowledged writes), each as a "figure: locks.<guard>.<name>" line.
//
// Then, safety: for each guard, holder A takes the guard and reads the
// counter, then pauses (as a GC pause or SIGSTOP would stop it) until B
// has taken the guard over and written; then A writes what it computed
// before the pause. The program counts the writes of A that reach the
// store after B's ("figure: locks.<guard>.stale_writes_landed") and says
// in a line why each guard let it in or kept it out. A lock service can't
// stop a holder that doesn't know it was paused; the store can.
//
// With -delay, PostgreSQL, Redis and etcd are each reached through a proxy
// on loopback that adds that time to each direction of a round trip, as
// across a network; its figures are named "locks_far.<guard>.<name>".
//
// In this program the tenure guard's clients run in the owner's process:
// routing a call to the owner costs, in a deployment, the gRPC hop the
// transport package measures (routed over direct about 1.0x).
//
// It exits non-zero if tenure's guard let a stale write in, or if a guard
// failed to run.
package main
