//go:build unix

// Command demo starts a tenure cluster of five kvstore nodes as child
// processes on loopback and drives clients writing and reading through
// them while it injects faults in turn:
//
//   - a pause of a node past its lease (a real SIGSTOP, then SIGCONT)
//     while it holds a write with its old token, which the fence must
//     refuse when the node resumes;
//   - a crash (SIGKILL) and a restart under the same name;
//   - a network cut between two groups of nodes (2|3), then the heal;
//   - a graceful leave.
//
// The nodes keep their data in one SQLite file (or PostgreSQL with -dsn),
// every write fenced with its lease's token. At the end the demo reads every
// key back, checks the write log for stale writes, and checks the whole
// history of calls for linearizability, key by key, with porcupine. It
// prints a report with figure lines and exits non-zero if any check fails.
// It also writes the report as a picture, one self-contained HTML file
// (path printed; -report chooses it): throughput and failures over time,
// each fault marked, the failover and handoff windows shaded, the stale
// writes the fences rejected marked where they happened, and the checks.
//
//	go run ./examples/demo                 # about 40 seconds
//	go run ./examples/demo -phase 300ms    # the short run CI does
//	go run ./examples/demo -phase 10s -writers 32 -partitions 271
//
// The nodes are this same program started with the hidden first argument
// "kvnode"; that runs examples/kvstore's node (kvnode.Main).
package main
