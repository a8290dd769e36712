// Package resource is the resource side of tenure over gRPC: a server that
// other nodes write to on behalf of their partitions (a storage service, a
// downstream API) checks the fencing token each call carries. It needs
// nothing of the cluster: it imports neither the coordinator nor
// memberlist nor Prometheus, only the wire vocabulary of package transport
// and the tokens and fences of package ownership.
//
// # The caller's duties, in order
//
//  1. Build a TokenGuard with the cluster's Keyring (so a forged token is
//     refused) and pass its ServerOptions to grpc.NewServer.
//  2. Make every write under the call's token atomic with its check.
//     Either set TokenGuardConfig.Fence (an ownership.MemoryFence, say):
//     the handler runs inside Fence.Do, and no fence of a higher token
//     completes before it returns. Or judge the token inside the write's
//     own transaction: sqlfence.Fence.Do with TokenFrom(ctx).
//  3. Return the fence's errors as they are: the guard turns them into
//     statuses the caller's node understands (a stale token carries the
//     resource's current one, which ends the caller's lease).
//
// A Checker alone only checks, before the handler runs: it refuses tokens
// that are stale when the call arrives, and promises nothing about the
// handler's write, which may land after a newer owner fenced the resource.
//
// Callers attach their lease's token with transport.TokenUnaryClientInterceptor
// and transport.TokenStreamClientInterceptor (inside a guarded handler the
// token of the call being served goes along by itself).
package resource
