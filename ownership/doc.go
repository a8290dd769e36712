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
//   - An Authority mints tokens. GossipAuthority takes epochs from the
//     gossiped Register (merge = max); sqlfence's authority issues them
//     strictly from the database.
//   - Machine is the per-node lease state machine: pure and deterministic,
//     no goroutine, clock or socket. The shell (package coordinator) feeds
//     it events and performs the Actions it returns, in order.
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
package ownership
