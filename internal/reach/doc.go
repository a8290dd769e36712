// Package reach is the reach check's policy: which members a node pings
// directly, when, and which of them it counts as unreachable. It is pure:
// no goroutine, no socket, time comes in as arguments. The coordinator's
// loop performs the pings it asks for and feeds the answers back; the
// simulator does the same against its model of the network, so both run
// one policy.
//
// Why the check exists: a node cut off from the rest keeps the others in
// its member list until its failure detector gives up on them, and
// memberlist's Lifeguard makes that slow on purpose. Counted against the
// member list alone, the isolated node would keep its quorum, and its
// leases, after the majority claimed its partitions.
//
// The policy, per round (one every Interval, only while the caller reports
// trouble or, while the node starts, some member is unvouched (Hearsay,
// below), and never while the node itself is late):
//
//   - it pings SampleSize(n) members of an n-member view, those pinged
//     least recently first, ties broken at random: O(log n) pings per
//     node per Interval (4 up to 16 members, 6 at 50, 7 at 100, 14 at
//     10,000), so every member is pinged about every (n-1)/SampleSize(n)
//     rounds;
//   - a member that missed Misses pings in a row, over at least Span, is
//     unreachable (small views: every member is pinged every round);
//   - and the node as a whole is cut off when, over the rounds of the last
//     Span (at least Misses of them), the answers it got estimate fewer
//     reachable peers than half the view: a quorum's worth of answers
//     decides. Then every member that has not answered within Span is
//     unreachable. This is what ends an isolated node's leases in time in
//     a large view, where each member is pinged only now and then;
//   - a member counts as unreachable for Hold at most (by then memberlist
//     has dropped a member that is really gone), and one answer clears it.
//
// Self-awareness: the caller reports the lag of its own loop (how late a
// tick ran). A node whose lag exceeds LagLimit is late: it starts no round
// until it has been on time for an Interval, and a round during which it
// was late (or whose answers it took longer than Timeout plus LagLimit to
// read) does not count, since a ping it could not wait for properly is
// evidence against itself, not against the member. A node late for a whole
// Span therefore has no verdict: it keeps memberlist's.
//
// Hearsay, while a node starts: a node that joins takes its seed's member
// list whole, and on the minority side of a split the seed still lists
// members it can no longer reach (its failure detector has not given up on
// them yet; its own check counts them unreachable, but that verdict is its
// own). So from Start until Start+Hold, a member of that list (Joined)
// counts for this node's quorum only once this node has had word from its
// life directly (Vouch: an answer to memberlist's probe or to the check's
// ping); until then it is Unvouched. Members that show up later came to
// the cluster themselves and count at once. After Start+Hold the node's
// own failure detector has had its say on every member it lists (one
// really gone is dropped, one that answers only by other paths, such as
// TCP, counts), and hearsay is over for good: an established node never
// holds back for it (the first version of this rule applied to every new
// life a node saw, and cost established nodes their quorum when members
// restarted). While some member is unvouched a round is due even without
// trouble: it pings only unvouched members (SampleSize at most), and its
// answers only vouch (its misses are no evidence).
package reach
