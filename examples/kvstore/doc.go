// Command kvstore is a fenced key-value node: run several, on one machine
// (sharing a SQLite file) or on several (sharing a PostgreSQL database),
// and call Put and Get on any of them. See package kvnode for what it does
// and the flags.
//
//	kvstore -name n1 -gossip 127.0.0.1:7946 -grpc 127.0.0.1:7947 -status 127.0.0.1:8080
//	kvstore -name n2 -gossip 127.0.0.1:7956 -grpc 127.0.0.1:7957 -seeds 127.0.0.1:7946
//
// SIGINT or SIGTERM makes the node hand its partitions off and exit.
package main
