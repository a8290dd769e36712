// Package faultnet is a fault-injecting memberlist transport for cluster
// tests: many memberlist (or tenure coordinator) nodes in one process, on
// real UDP and TCP sockets bound to 127.0.0.1, whose traffic passes through
// faults set by the test.
//
// A Network is the controller shared by every node of one test cluster.
// Network.Transport binds a Transport (a memberlist.NodeAwareTransport
// wrapping a real memberlist.NetTransport) for a named node and records
// which address belongs to which name, so faults are stated in node names:
//
//   - Partition(groups...): nodes in different groups can't talk; nodes in
//     no group talk to everyone (a bridge).
//   - Cut(from, to): packets from -> to are dropped, to -> from still pass.
//   - Isolate(name): the node can't talk to anyone.
//   - Mute(name): the node's packets are dropped; its streams pass.
//   - Drop(fraction): that fraction of all packets is lost, at random.
//   - Delay(d): every packet arrives d late; senders don't block.
//   - Heal(): all of the above removed.
//
// Packets (memberlist's UDP probes and gossip) honour every fault exactly,
// one-way cuts included. Streams (memberlist's TCP push/pull, joins, and
// fallback probes) need both directions, as TCP does: a dial across a fault
// in either direction fails at once with an error wrapping ErrLinkDown, and
// Drop and Delay don't apply to streams. A stream already open when a fault
// starts is left alone (memberlist's streams are short-lived).
//
// Caller's duties, in order:
//
//  1. Build one Network per test with New (pass WithSeed to vary the
//     random drops; the default seed is fixed).
//  2. For each node, call Network.Transport with the node's name and set the
//     result as memberlist.Config.Transport, with Config.Name equal to that
//     name. Leave Config.AdvertiseAddr empty (or set it to the Transport's
//     address): a Transport refuses to advertise another address.
//  3. Join other nodes by Transport.Addr or Network.Addr.
//  4. Set faults while the cluster runs and wait for their effect by polling
//     memberlist.Members with a deadline.
//  5. Shut every node down. memberlist.Shutdown calls Transport.Shutdown,
//     which closes the sockets and open streams and waits for the
//     Transport's goroutines, so the node vanishes as in a crash. Call
//     Transport.Shutdown yourself for a Transport no memberlist owns.
//
// memberlist behaviours a test must allow for:
//
//   - memberlist never probes a node it declared dead, so after Heal the
//     sides stay split until a node joins the other side again.
//   - A node restarted under the same name (a new Transport, on a new port)
//     is refused by the survivors ("conflicting address") unless they set
//     Config.DeadNodeReclaimTime, or until they forget the dead node
//     (Config.GossipToTheDeadTime after it died).
//   - Drop(1) alone seldom kills anyone: memberlist falls back to TCP
//     probes and push/pull, which Drop doesn't touch, though a slow TCP
//     probe can make a node flap dead and back. Use Isolate or Partition
//     for a clean failure.
//   - Indirect probes route around faults: a node in no partition group
//     keeps both sides alive to each other, and so does any third node
//     for a one-way Cut.
//
// Faults between names apply to every Transport of that name, so a zombie
// and its replacement are both affected. An address that belongs to no
// Transport of the Network is outside the fault model: only Drop and Delay
// apply to it.
package faultnet
