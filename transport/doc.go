// Package transport is tenure's wire contract over gRPC: the metadata a
// routed call carries (its key, a fencing token, a request id), the
// statuses a node or a resource answers with, and how to read them back.
// It imports no part of the cluster, so a program in any role can use it.
//
// The two sides that speak it live in their own packages:
//
//   - transport/routing, for the nodes of a cluster: a Router that sends
//     each call to its key's owner and follows the membership, an
//     OwnerGuard that serves a key only under its lease, health and the
//     ownership service;
//   - transport/resource, for a server that other nodes write to under
//     their tokens (a storage service): a TokenGuard that checks each
//     call's token. It needs neither the coordinator nor memberlist nor
//     Prometheus.
//
// # Wire contract
//
// The key travels in binary metadata KeyMetadata ("tenure-key-bin"), one
// value of 1 to MaxKeySize bytes; a token in TokenMetadata
// ("tenure-token"), in ownership.Token's text form; a request id in
// RequestIDMetadata ("tenure-request-id"). Refusals are statuses with a
// google.rpc.ErrorInfo detail in ErrorDomain:
//
//   - FailedPrecondition, ReasonNotOwner: the owner's name, address, epoch
//     and token (OwnerHint decodes it); the owner's name and address also
//     ride in plain trailing metadata, OwnerMetadata ("tenure-owner") and
//     OwnerAddrMetadata ("tenure-owner-addr"), for clients that don't
//     decode details (NotOwnerTrailer);
//   - Unavailable, ReasonHandoff: the partition is moving and nothing was
//     applied; retry shortly;
//   - Unknown, ReasonOutcomeUnknown: the call may have been applied; a
//     retry may apply it twice unless it carries a request id
//     (AsOutcomeUnknown, IsOutcomeUnknown);
//   - FailedPrecondition, ReasonStaleToken: a resource holds a newer token,
//     carried in the detail (StaleFromStatus decodes it; pass it to
//     coordinator.ReportStale);
//   - FailedPrecondition, ReasonNotFenced: the token is above the
//     resource's mark: its owner must fence first;
//   - InvalidArgument: no key, an empty, repeated or oversized key, a
//     malformed, repeated or oversized token or request id;
//   - Unauthenticated: a token whose MAC fails.
//
// Every status built here survives the wire whatever text it carries (a
// driver's message, an owner's name): its message and detail are valid
// UTF-8, bounded and cut at a character boundary, since protobuf refuses
// anything else and gRPC would then drop the detail, and with it the
// status's meaning.
//
// # Request ids
//
// A write that may be retried (by a Router after an owner failed, or by
// the caller after an unknown outcome) carries a request id
// (WithRequestID): the owner's fenced transaction records it with the
// partition and answers a duplicate with the first outcome instead of
// applying it again (ownership/sqlfence's Requests does that in SQL).
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
