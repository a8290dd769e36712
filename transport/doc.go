// Package transport carries tenure's ownership over gRPC: clients send each
// call to the node that owns its key, servers refuse the keys they don't
// own, and fencing tokens travel with calls to the resources they protect.
//
// # A node (the server side)
//
//  1. Listen first, and set coordinator.Config.ServiceAddr to the address
//     clients will dial, so the coordinator gossips it to the others.
//  2. Start the coordinator.
//  3. Build an OwnerGuard on the coordinator and pass its ServerOptions to
//     grpc.NewServer, with Keepalive.ServerOptions and, off a trusted
//     network, ServerCredentials.
//  4. Register the application's services, NewHealth (NOT_SERVING once the
//     node starts leaving) and, for clients in other languages,
//     NewOwnershipService.
//  5. In handlers, take the lease with LeaseFrom and pass its token to every
//     write (the resource is the judge); the handler's context ends when the
//     lease does. Return fence errors as they are: the guard turns them into
//     statuses (StatusFromError).
//  6. To stop: coordinator Leave (handlers drain, partitions move), then
//     grpc.Server.GracefulStop, then Health.Close.
//
// # A client
//
// Build a Router on the process's coordinator (RouterConfig.Owners) and pass
// it wherever a grpc.ClientConnInterface goes (generated NewXClient
// functions). Put each call's key in its context with WithKey and give it a
// deadline. The router sends the call to the key's owner as the local
// coordinator sees it; when that node answers not-owner it follows the
// answer's hint (bounded, with a loop guard), and when the owner is being
// handed over or can't be reached it waits and asks again, bounded by
// RouterConfig.MaxAttempts and the context. It never sends a key to a node
// that isn't its owner because the owner is unreachable: an unreachable
// owner is a wait, then an error.
//
// # Wire contract
//
// The key travels in binary metadata KeyMetadata ("tenure-key-bin"), one
// value of 1 to MaxKeySize bytes; a token in TokenMetadata
// ("tenure-token"), in ownership.Token's text form. Refusals are statuses
// with a google.rpc.ErrorInfo detail in ErrorDomain:
//
//   - FailedPrecondition, ReasonNotOwner: the owner's name, address, epoch
//     and token (OwnerHint decodes it);
//   - Unavailable, ReasonHandoff: the partition is moving; retry shortly;
//   - FailedPrecondition, ReasonStaleToken: a resource holds a newer token,
//     carried in the detail (StaleFromStatus decodes it; pass it to
//     coordinator.ReportStale);
//   - InvalidArgument: no key, an empty, repeated or oversized key, a
//     malformed, repeated or oversized token;
//   - Unauthenticated: a token whose MAC fails.
//
// # Resource servers
//
// A service that other nodes write to on behalf of their partitions
// installs a TokenGuard: it decodes each call's token, verifies its MAC
// (TokenGuardConfig.Keyring) and checks it (a Checker, such as FenceChecker)
// before the handler runs. Callers attach tokens with
// TokenUnaryClientInterceptor and TokenStreamClientInterceptor, which take
// the token from WithToken, from the lease of the call being served, or
// from the token a TokenGuard admitted.
//
// # Operations
//
// ServerTLSConfig and ClientTLSConfig build TLS 1.3 (and mutual TLS)
// configurations; each node's certificate must name the host of its
// ServiceAddr. Keepalive keeps client pings at or above the servers' MinTime
// (gRPC servers close clients that ping faster), and DefaultKeepalive is a
// consistent pair.
//
// All the types of this package are safe for concurrent use.
package transport
