// Package routing is the node side of tenure over gRPC: it sends each call
// to the node that owns its key, and on that node serves the key only under
// its lease.
//
// # A node (the server side)
//
//  1. Listen first, and set coordinator.Config.ServiceAddr to the address
//     clients will dial, so the coordinator gossips it to the others.
//  2. Start the coordinator.
//  3. Build an OwnerGuard on the coordinator (GuardConfig.Leases and
//     GuardConfig.Stale) and pass its ServerOptions to grpc.NewServer, with
//     transport.Keepalive's ServerOptions and, off a trusted network,
//     transport.ServerCredentials.
//  4. Register the application's services, NewHealth (NOT_SERVING once the
//     node starts leaving) and, for clients in other languages,
//     NewOwnershipService.
//  5. In handlers, take the lease with LeaseFrom and pass its token to every
//     write (the resource is the judge); serve only the routed key
//     (GuardConfig.RequestKey, or compare with RoutedKey); pass each write
//     through the partition's gate (ownership/gate) so Release can drain
//     it. The handler's context ends when the lease does. Return fence
//     errors as they are: the guard turns them into statuses.
//  6. To stop: coordinator Leave (health turns NOT_SERVING at once, the
//     handlers drain, the partitions move), keep serving until the callers
//     have moved, then grpc.Server.GracefulStop, then Health.Close.
//
// # A client
//
// Build a Router on the process's coordinator (RouterConfig.Owners and
// RouterConfig.Membership) and pass it wherever a grpc.ClientConnInterface
// goes (generated NewXClient functions). Put each call's key in its context
// with transport.WithKey, give it a deadline, and give each write that may
// be retried a request id (transport.WithRequestID). The router sends the
// call to the key's owner as the local coordinator sees it; when that node
// answers not-owner it follows the answer's hint (bounded, with a loop
// guard), and when the owner is being handed over or can't be reached it
// waits and asks again, bounded by RouterConfig.MaxAttempts and the
// context. It never sends a key to a node that isn't its owner because the
// owner is unreachable: an unreachable owner is a wait, then an error. An
// attempt whose owner leaves the membership is cancelled at once; whether
// it is retried or fails with an unknown outcome is said on Router.
//
// # What a not-owner hint is trusted for
//
// A not-owner answer names an owner and its address, and comes from
// whichever server answered: the router trusts it only to choose which
// current member to try next. It follows a hint only to the service
// address of a member its Membership lists now, and expects there the
// node the membership names, not the one the hint names; a hint to any
// other address is not dialed, and the call pauses and asks Owners again,
// as after a loop. So the router's connections are the members' (closed
// when they leave), whatever the servers answer, and a server can't send
// a call to an address outside the cluster. A hint never overrides
// fencing: the node it leads to serves the key only under its own lease.
//
// All the types of this package are safe for concurrent use.
package routing
