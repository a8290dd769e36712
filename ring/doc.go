// Package ring maps keys to partitions and partitions to owning members.
//
// A Table is built from a set of member names and a Config. It answers, for
// any key, its partition (xxhash64 of the key modulo Config.Partitions) and
// the partition's owner, and for any partition a stable list of replicas.
// Diff lists the partitions whose owner changed between two Tables. The
// package is pure: no goroutines, clocks or I/O.
//
// # The partition function
//
// A key's partition is part of the wire protocol: clients in other
// languages compute it to send a call straight to its owner. It is
//
//	partition = XXH64(key, seed 0) mod Partitions
//
// where XXH64 is the 64-bit xxHash of the key's bytes exactly as given (no
// length prefix or terminator; a string key is its bytes), with seed 0 (as
// github.com/cespare/xxhash/v2's Sum64), and mod is the unsigned 64-bit
// remainder by Config.Partitions, so partitions are 0 to Partitions-1. For
// example "user:42" hashes to 0xdc1fea7da8d2d1c2, partition 195 of 271.
// testdata/partition_vectors.txt lists test vectors (the empty key, binary
// keys, every XXH64 length class, a 4096-byte key, several partition
// counts); TestPartitionVectors checks this package against them.
// Partition and PartitionString compute it without a Table, for a
// producer that is not a member.
//
// # Caller's duties, in order
//
//  1. Run one placement on every node. Publish AlgorithmVersion and the
//     Config in node metadata and refuse to form a cluster with a node that
//     reports different ones: nodes that disagree on either compute different
//     owners for the same members. Table.Fingerprint summarizes the version,
//     the Config and the member set in 64 bits for a cheap comparison.
//  2. On every membership change, build a new Table with New from the whole
//     current member set. A Table is never edited: New copies the names, and
//     the result depends on the set only, not on the order of the slice or on
//     the history of joins and leaves. Rebuild builds the same Table from
//     the previous one, faster: it hashes only the new members' points. If
//     New or Rebuild returns an error (invalid Config or member name), keep
//     serving with the previous Table.
//  3. Publish the new Table through a Holder (Store). Request paths Load the
//     Table once per request and use that one Table for every lookup of the
//     request, so a request never mixes two placements.
//  4. Drive handoffs from Diff(previous, next): each Move names a partition,
//     its old owner and its new one.
//
// # Contracts
//
// A Table is immutable and safe for any number of concurrent readers with no
// locking. Lookup, LookupString, Partition, PartitionString, Owner, Has and
// Load neither lock nor allocate. A key's partition depends only on the key
// and Config.Partitions, never on the members. A nil *Table behaves as an
// empty table (lookups return partition -1 and owner ""), so the zero Holder
// is safe to read before the first Store. Slices returned by Members,
// Replicas, PartitionsOf and Diff belong to the caller. No input makes a
// function of this package panic: bad input is an error from Config.Validate
// or New.
//
// Member names are non-empty, at most MaxMemberNameLen bytes, contain no NUL
// byte and are distinct. There may be more members than partitions; the extra
// members own nothing but still appear in Members and Replicas.
//
// # Placement
//
// Owners are placed exactly as github.com/buraksezer/consistent v1.0.0 places
// them (consistent hashing with bounded loads) with an xxhash64 hasher and
// each member's String() being its name followed by a NUL byte: every member
// has Config.VirtualNodes points on a hash ring, and partitions, in ascending
// order, go to the first member clockwise from the partition's hash that owns
// fewer than ceil(Partitions/members × Load) partitions. The NUL suffix keeps
// virtual-node keys unambiguous whatever their layout ("node1"+"10" versus
// "node11"+"0"). The tests compare every owner and lookup with consistent
// itself on random member sets, and with a naive reference.
//
// The package reproduces the algorithm instead of calling consistent, for two
// reasons. consistent.New re-sorts the whole ring after adding each member, so
// building grows with the square of the member count: at 200 virtual nodes
// and 1000 members it takes about 9 s where New takes about 13 ms, and
// Rebuild after a join about 2 ms (BenchmarkNew, BenchmarkRebuild). And
// consistent.LocateKey takes a read lock on every call, which costs several
// times a plain lookup and contends between cores; a Table's lookups read
// immutable slices.
//
// # Choosing VirtualNodes and Load
//
// The load bound trades balance for movement. A member whose natural share
// exceeds the bound spills partitions to the next members on the ring, and
// spilled partitions are the ones that move more than necessary when a member
// joins or leaves. Fewer virtual nodes make natural shares more uneven, so
// more partitions spill. Measured by TestFigures over 200 random sets of 10
// members at 271 partitions (movement as a multiple of the ideal 1/11 for a
// join and 1/10 for a leave; load as the busiest member over the average):
//
//	virtual nodes  load  join   leave  busiest/average (mean, worst)
//	20             1.25  1.16x  1.16x  1.253, 1.255   consistent's defaults
//	200            1.25  1.06x  1.05x  1.239, 1.255   DefaultConfig
//	200            1.20  1.08x  1.07x  1.211, 1.218
//
// DefaultConfig uses 200 virtual nodes and load 1.25: joins and leaves move
// within 6% of the ideal, and the busiest member owns 1.24x the average on
// average. Past 200 points movement barely improves (the rest comes from the
// randomness of the 271 partition hashes themselves), while build time and
// memory keep growing linearly with members × VirtualNodes. Load 1.2 caps the
// busiest member at 1.22x the average for 10 members instead of 1.255x, and
// moves about 2% more.
//
// Replicas after the owner are the next distinct members clockwise from the
// partition's hash. They are not bounded by Load, but they differ between the
// partitions of one owner (consistent's GetClosestN gives all of them the
// same followers), and a membership change disturbs them little.
package ring
