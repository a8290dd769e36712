// Package quorum holds the stable membership a node counts its quorum
// against (L4, see package ownership for the promises) and the majority
// rule: Stable, its compact StableID, and Majority. It is pure and imports
// nothing of tenure, as etcd raft's quorum package holds its vote rules.
//
// The tracker that applies these rules on a node's logical clock (when a
// view is stable enough to promote, whom to ask for a newer membership) is
// part of the state machine, package ownership/machine.
package quorum
