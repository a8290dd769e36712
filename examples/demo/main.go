//go:build unix

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

	"github.com/tenure-go/tenure/internal/faultctl"
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
	flag.StringVar(&cfg.report, "report", "", "where to write the report as a picture, an HTML file (default: a new file in the temporary directory)")
	flag.BoolVar(&cfg.strictLeave, "strict-leave", true, "fail the run if a call failed or an outcome was left unknown during the graceful leave (L2); -strict-leave=false shows those rows without judging them")
	flag.BoolVar(&cfg.pressure, "pressure", false, "run every phase on a busy machine: two busy loops per core (internal/pressure) from before the workload starts until it stops; the report marks the span")
	flag.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL DSN: the nodes keep their data there instead of in a SQLite file")
	flag.BoolVar(&cfg.netns, "netns", false, "run each node in a network namespace of its own (Linux, root, iproute2 and nftables; needs -dsn): the cut drops gossip, gRPC and the database's traffic in the kernel instead of inside the nodes")
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
	if err := faultctl.Main(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvnode:", err)
		return 1
	}
	return 0
}
