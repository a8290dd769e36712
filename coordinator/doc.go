// Package coordinator embeds partition ownership in a process: it gossips
// membership with memberlist, places partitions on members with the ring
// package, and runs the ownership state machine that claims, fences,
// acquires and releases leases, one per partition this node owns.
//
// The caller's duties, in order:
//
//  1. Build a Config from a preset (LocalConfig for tests and demos,
//     LANConfig, WANConfig) and set Name, Handler, ServiceAddr and Seeds.
//     Every node of a cluster uses the same ClusterName, Ring config and
//     gossip keys.
//  2. New validates it; it does not touch the network. Start binds gossip,
//     joins the seeds and starts claiming.
//  3. Handler.Acquire is called for each partition granted to this node.
//     Fence every resource the partition writes to with the lease's token
//     before reading its state or serving (Config.Fence does it for one
//     resource). Handler.Release is called when the partition moves away:
//     drain in-flight writes, then return.
//  4. Route each request by key: Owner tells which node owns a key, Lease
//     returns this node's lease for it. Attach lease.Token() to every write;
//     the resource rejects stale tokens. When it does, pass the error to
//     ReportStale so the lease ends at once.
//  5. Leave hands every partition off (zero rejected writes for a handler
//     that drains) and leaves; Close alone is a crash to the others.
//
// Safety never depends on timing: a paused or cut-off owner is stopped by
// the fence at the resource, not by the coordinator. The timings (tick,
// grace, step-down, handoff timeout) only decide how fast ownership moves
// and how many writes a stale owner sees rejected.
//
// Concurrency: every method of Coordinator is safe for concurrent use.
// Handlers run on the coordinator's goroutines, concurrently for different
// partitions. Nothing the coordinator does blocks memberlist: membership
// events and gossip are handed to one loop goroutine.
package coordinator
