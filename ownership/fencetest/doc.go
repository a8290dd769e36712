// Package fencetest is the contract every ownership.Fence keeps, as a
// test suite that any implementation runs: the memory fence, the SQL and
// etcd fences, and a fence of your own for a store tenure does not ship.
//
// A caller's duties, in order:
//
//  1. Wrap the fence in a Subject: the fence itself, how to read a
//     partition's mark, and one fenced write of a key (the fence's Do, in
//     whatever shape it takes) and a read of it.
//  2. Give Run a Config whose New returns a fresh Subject for each test
//     (a table, key prefix or database of its own, released with
//     t.Cleanup), and, if the fence can verify and sign tokens, NewKeyed.
//  3. Call Run from one test function of the fence's package.
//
// What the suite checks: a fence advances and never falls back, and a
// stale fence learns the mark; writes in Exact and Monotonic mode apply
// exactly when the fence says; many writers and a fencer racing on one
// partition leave a history in which no write under a superseded token
// applied after the fence that superseded it, no write refused left a
// trace, and no write accepted was lost; a keyed fence refuses unauthentic
// tokens and signs the mark of every stale answer; a strict Authority
// issues each epoch once, densely and in real-time order (S4).
//
// The suite's tests run in parallel with each other, each on its own
// fresh Subject, and every one is bounded by a minute.
package fencetest
