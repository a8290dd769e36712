// Command kvstore is a fenced key-value node: run several, on one machine
// (sharing a SQLite file) or on several (sharing a PostgreSQL database),
// and call Put and Get on any of them. See package kvnode for what it does
// and the flags.
//
//	kvstore -name n1 -gossip 127.0.0.1:7946 -grpc 127.0.0.1:7947 -status 127.0.0.1:8080
//	kvstore -name n2 -gossip 127.0.0.1:7956 -grpc 127.0.0.1:7957 -seeds 127.0.0.1:7946
//
// SIGINT or SIGTERM makes the node hand its partitions off and exit (its
// health service answers NOT_SERVING at once; it serves until its clients
// have moved).
//
// Besides kvnode's flags the command has -fault-control, for tests and
// demos only (package internal/faultctl), which serves on the status
// server:
//
//	POST /debug/cut?peers=IP:PORT,...  cut this node off from those gossip addresses (and their gRPC); no peers heals
//	POST /debug/hold?partition=N        hold the next write to partition N after the gate, before the database
//	GET  /debug/hold?partition=N        {"waiting": true} once a write waits at N's hold
//	POST /debug/release?partition=N     let the held write go on (under its old token)
package main
