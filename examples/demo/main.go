//go:build unix

// Command demo starts a tenure cluster of five kvstore nodes as child
// processes on loopback, drives a concurrent workload of fenced writes
// through them, and injects faults in turn: a pause of a node past its
// lease (a real SIGSTOP), a crash (SIGKILL) and a restart under the same
// name, a network cut between two groups of nodes, and a graceful leave.
// The nodes keep their data in one SQLite file (or PostgreSQL with -dsn),
// every write fenced with its lease's token.
//
// It ends with a report, reads every key back, checks the write log, and
// exits non-zero if an acknowledged write was lost or a stale write was
// accepted.
//
//	go run ./examples/demo                 # about a minute
//	go run ./examples/demo -phase 300ms    # the short run CI does
//	go run ./examples/demo -phase 10s -writers 32 -partitions 271
//
// The nodes are this same program started with the hidden first argument
// "kvnode"; that runs examples/kvstore's node (kvnode.Main).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
)

// nodeCommand, as the first argument, makes this program a kvstore node.
const nodeCommand = "kvnode"

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNode(os.Args[2:]))
	}

	var cfg config
	flag.IntVar(&cfg.nodes, "nodes", 5, "nodes to start (at least 5: the cut splits them 2|3)")
	flag.IntVar(&cfg.partitions, "partitions", 64, "partitions of the key space")
	flag.IntVar(&cfg.writers, "writers", 16, "concurrent writers (each owns its keys)")
	flag.IntVar(&cfg.keys, "keys", 64, "keys per writer")
	flag.DurationVar(&cfg.phase, "phase", 3*time.Second, "how long the workload runs between faults")
	flag.DurationVar(&cfg.pause, "pause", 5*time.Second, "how long a node stays paused (SIGSTOP); longer than its lease")
	flag.DurationVar(&cfg.cut, "cut", 5*time.Second, "how long the network cut lasts")
	flag.DurationVar(&cfg.timeout, "timeout", 8*time.Second, "deadline of one client call; longer than -pause, so calls a paused node had taken go on after it resumes")
	flag.StringVar(&cfg.dir, "dir", "", "directory for the SQLite file and node logs (default: a new temporary directory, removed at the end unless -keep)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the directory with the database and node logs")
	flag.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL DSN: the nodes keep their data there instead of in a SQLite file")
	flag.Parse()
	if cfg.nodes < 5 {
		log.Fatal("demo: -nodes must be at least 5")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ok, err := run(ctx, cfg)
	stop()
	if err != nil {
		log.Fatalf("demo: %v", err)
	}
	if !ok {
		os.Exit(1)
	}
}

// runNode runs this process as a kvstore node until SIGINT or SIGTERM,
// which make it leave the cluster gracefully.
func runNode(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := kvnode.Main(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvnode:", err)
		return 1
	}
	return 0
}
