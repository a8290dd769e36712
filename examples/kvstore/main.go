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

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kvnode.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
