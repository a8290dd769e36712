// Package ownership is the core of tenure: what an owner holds, what it
// attaches to its writes, and what the protected resource checks.
//
//   - A Token (partition, epoch, owner, incarnation) is a grant. Tokens of a
//     partition are totally ordered; ParseToken and ParseTokenText decode
//     the binary and text forms from the network and never panic. A Keyring
//     signs tokens with a MAC so resources can refuse forged ones.
//   - A Fence is the resource side: it keeps the highest token per
//     partition and rejects lower ones with a *StaleTokenError (errors.Is
//     ErrStaleToken) that carries the current token. MemoryFence serves
//     resources inside one process; package sqlfence serves SQL databases,
//     and the module etcdfence etcd. Fences that authenticate tokens take a
//     Verifier and sign their stale answers with a Signer (a Keyring is
//     both). Package fencetest is the contract every Fence keeps, as a
//     test suite to run against a fence of your own.
//   - An Authority mints tokens. Package ownership/gossip's takes epochs
//     from the gossiped register (merge = max); sqlfence's authority issues
//     them strictly from the database. Package ownership/gossip is also the
//     gossip codec, whose MACs a Keyring makes.
//   - The per-node lease state machine is package ownership/machine: pure
//     and deterministic, no goroutine, clock or socket. The shell (package
//     coordinator) feeds it events and performs the Actions it returns, in
//     order. The stable membership it counts its quorum against, and the
//     majority rule, are package ownership/quorum.
//   - A Lease is the grant as the application sees it: a Token and a
//     context cancelled the moment the lease ends.
//
// The caller's duties, as an owner: fence every resource with the lease's
// token before reading its state or serving (S2); attach the token to every
// write; treat ErrStaleToken as the end of the lease. As a resource: check
// every write's token (Exact where owners fence on acquire, Monotonic where
// they may not), atomically with the write (MemoryFence.Do, sqlfence's Do).
//
// Cancellation of a lease's context is advisory: a paused process can't
// see it in time. Only the fence makes a stale owner harmless.
//
// # Words
//
// One word per concept, across tenure's packages:
//
//   - A grant is one node's right to a partition, named by its Token; the
//     epoch orders a partition's grants, the incarnation names the process
//     (Node) that holds one. A Lease is a grant as its holder sees it.
//   - A claim (gossip.Claim) is what gossip says about a partition: a grant,
//     or its release. The register (gossip.Register) holds a node's claims;
//     the coordinator's registry holds its leases (never called a register).
//   - The mark is the highest token a fence has applied or fenced for a
//     partition. Whatever reports it calls it Current: StaleTokenError,
//     ConflictError and NotFencedError (whose Mark is a deprecated copy), and
//     MemoryFence.Current.
//   - A lease ends (ErrLeaseEnded) for one cause: released (a planned
//     handoff after the drain), resigned, superseded, no quorum, not fenced,
//     timeout, or failed (fencing or the handler's Acquire failed). Only a
//     planned handoff is a release; a claim's Released flag gossips it.
//     coordinator.EventLeaseEnded reports any end, with its cause
//     (EventReleased is its deprecated old name).
//   - A member's share is how many partitions the ring gives it
//     (ring.Table.Share); "load" is kept for the work a partition costs.
//   - The stable membership is the member set a node counts its quorum
//     against (package ownership/quorum); a quorum is more than half of it.
//   - Error messages start with their package's name (Go's convention).
//     The sentinel errors of this package and of package transport start
//     with "tenure:": they are the protocol's words and reach clients of any
//     language in gRPC status details.
//
// # Promises
//
// The code, its tests, the simulator and the chaos suite name tenure's
// promises by these labels (README.md, "What is promised", states them in
// full). Safety, under any pause, partition, crash or clock skew:
//
//   - S1 Fencing: a fenced resource never applies a write whose token is
//     lower than one it has applied or fenced for that partition.
//   - S2 Fence on acquire: a new owner fences the resource before it reads
//     state or serves, so a stale owner's late write can't change what the
//     new owner read.
//   - S3 Uniqueness: no two grants share a token (a new incarnation at
//     every process start; a strict authority never hands out an epoch
//     twice).
//   - S4 Strict issuance, with the SQL or etcd authority: per partition,
//     epochs increase in real-time order and one node holds each.
//
// Liveness, under the timing assumptions (coordinator.Config):
//
//   - L1 Stable ownership: with stable membership every partition has
//     exactly one owner, and an unrelated membership change doesn't move
//     (or re-fence) it.
//   - L2 Graceful handoff: a Leave or a join hands off with zero rejected
//     writes.
//   - L3 Failover: a crashed owner's partitions are re-owned within failure
//     detection plus Grace.
//   - L4 Step-down: a node that can't see a quorum (more than half) of the
//     stable membership ends its leases within StepDown.
//   - L5 No duels: a node fenced out by a live member does not claim again
//     until its view of membership changes (or the holder releases or
//     dies).
package ownership
