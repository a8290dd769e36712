// Package gossip is tenure's gossip: what nodes tell each other about
// partitions, on the wire and in memory.
//
//   - A Claim is what gossip says about a partition: the highest token
//     granted and whether it was released. A Register is a node's gossiped
//     knowledge, a Claim per partition, merged by taking the higher one.
//   - A Digest summarises a Register in at most DigestRanges 64-bit range
//     hashes, whatever the partition count; Digest.Diff names the ranges
//     two registers disagree on, Register.Sections carries a register's
//     claims in them and Register.Answer the claims above a peer's
//     (digest.go says how the exchange goes).
//   - A Message is one message of the gossip protocol (a claim, a stable
//     membership, a node's whole state or its digest, or a section of a
//     register), sealed with a MAC under the
//     cluster's ownership.Keyring and opened by Open, which never panics
//     and believes nothing it has not authenticated. The comment before
//     ErrWrongCluster (gossip.go) states what a replayed message can do.
//   - Authority is the embedded ownership.Authority: it mints epochs from a
//     Register, with no external system (not strict: two nodes with split
//     views can mint the same epoch; the fence keeps that safe).
//
// The state machine (package ownership/machine) consumes what this package
// decodes; the shell (package coordinator) carries the bytes.
package gossip
