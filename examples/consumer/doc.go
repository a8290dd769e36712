// Command consumer runs a sharded consumer of an append-only log inside one
// process and checks that no event's effect is applied twice, even when a
// partition moves in the middle of a batch. The code to copy is package
// github.com/tenure-go/tenure/examples/consumer/consumer; this command is
// the demonstration around it (scenario.go: a fault-injecting network, a
// batch held before its commit while its partition moves, the figures).
//
//	go run ./examples/consumer                 # SQLite in a temporary file, a few seconds
//	go run ./examples/consumer -events 10000 -nodes 5
//	go run ./examples/consumer -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It prints each step, then figures (consumer.events,
// consumer.stale_commits_rejected, consumer.double_applied, ...), and
// exits non-zero if an event was applied twice or missed, or the stale
// batch's commit was not rejected.
package main
