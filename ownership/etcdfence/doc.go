// Package etcdfence fences data kept in etcd and mints strong epochs
// there: each partition's high-water mark (the highest fencing token
// fenced) is one etcd key, an owner's operations run in one etcd
// transaction with a compare on that key, and an Authority claims epochs
// with a compare-and-put on the same key.
//
// It is a module of its own (github.com/tenure-go/tenure/ownership/etcdfence)
// so that the etcd client enters the build only of programs that import
// it. It takes a clientv3.KV (a *clientv3.Client, or a namespaced KV) and
// never dials etcd itself.
//
// # Keys
//
// Partition p's mark is at Config.Prefix + "p/" + p (default prefix
// "tenure/fence/"), its value the token's binary encoding without the MAC.
// A partition without a key has never been fenced. Nothing else may write
// under the prefix; Do refuses operations that would.
//
// # The caller's duties, in order
//
//  1. Connect a *clientv3.Client and pass it to New.
//  2. On acquiring a partition, Fence the lease's token (or take it from
//     Authority.Claim, which is also a fence) before reading the
//     partition's state or serving it. After Fence returns, no Do under an
//     older token applies anything. A stale-token error means a newer owner
//     exists: give the lease up.
//  3. Make every write to the partition's state through Do with the
//     lease's token. Writes made outside Do are not fenced.
//  4. On ownership.ErrStaleToken, end the lease. On an error wrapping
//     ownership.ErrOutcomeUnknown the transaction may have applied: fence
//     again and read back before relying on it.
//
// # What it promises
//
// S1: Do applies its operations only in a transaction whose compare found
// the token to be the mark (Exact) or raised the mark to it (Monotonic), and
// the mark only rises, so no write under a token lower than one applied or
// fenced ever applies. S2: a Fence is a transaction too; every Do after it
// in etcd's order compares against the new mark, so a stale owner can't
// change what the new owner reads after fencing. Unlike a SQL fence
// there is no lock to hold: a paused holder's transaction either applied
// before the fence or fails its compare, and nobody waits for it. S4:
// Authority.Claim gives each epoch to one node, densely and in real-time
// order, etcd's transactions being linearizable.
//
// The package's TestChaos is the chaos suite's etcd run (coordinators
// with this authority and fence over a fault network, histories checked
// with internal/chaos's porcupine model, S4 on the claims, a control run
// without the check that must be caught).
//
// The package works with etcd 3.4 and later servers (it needs nested
// transactions only if the caller passes clientv3.OpTxn).
package etcdfence
