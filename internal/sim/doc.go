// Package sim is a deterministic simulator of a tenure cluster: N real
// ownership.Machines (with their real quorum and stable-membership code,
// registers, gossip authorities and gossip codec) wired to a model of the
// rest of the world, driven by one seeded random source on logical time.
// A seed replays exactly, event for event.
//
// The model: per-node membership views that follow a connectivity matrix
// with detection delays (one-way cuts, partitions, drops, delays, crashes,
// restarts with new incarnations, pauses, clock skew, graceful leaves
// (the handoff, then a goodbye a member counts only if it heard it, then
// memberlist's leave message; schedules overlap them with splits and
// crashes),
// the coordinator's reach check, run by the coordinator's own policy
// (internal/reach) on the model's pings, and late nodes whose loops lag
// and whose ticks bunch; each view is built by the coordinator's own
// function, machine.BuildView, from the members' metadata as it is now:
// the model does not yet delay a change of it by the gossip that carries
// it),
// gossip broadcasts and push/pull state exchanges carried as the real
// encoded messages, an authority (each node's gossip authority, or a strict
// compare-and-swap authority like the SQL one), a fenced resource in Exact
// mode, handlers with delays and overruns, writers whose writes can be held
// past a pause, and an adversary that forges gossip and replays authentic
// messages it copied off the wire, late and on the wrong channel (a
// broadcast as push/pull state, a state as a broadcast).
//
// Checks, after every event: no message from the network crashes a node
// (a panic in its delegate); S1 (the resource never applies a write below
// its mark), S2 (a lease is served only once the resource was fenced with
// it), S3 (no token is minted twice), S4 with the strict authority (epochs
// dense and in order, one holder each); no lease granted to a node that has
// sat in a minority of the live nodes for longer than detection and step
// down; no two groups serving with a quorum of stable memberships of the
// cluster's lineage at once; no claim storms; the handler contract (one Release for every
// Acquire that succeeded, and a partition's calls never overlap unless one
// overran its deadline). After every heal, within a bound: one owner per
// partition, its ring owner, holding the resource's mark, agreed on by
// every node; a bounded number of new epochs per partition (no duels).
//
// The scale mode (Config.Scale, scale.go) runs large clusters for the
// cost model (COST.md): broadcasts through memberlist-like gossip queues,
// and messages and bytes counted per kind, with the checks still on.
//
// The package is for tenure's own tests: see sim_test.go for the
// randomized runs, the negative controls and the figures, and
// testdata/*.txt for scripted scenarios.
package sim
