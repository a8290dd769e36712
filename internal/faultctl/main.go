package faultctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
)

// Main is kvnode.Main with one flag more, -fault-control, which installs
// the fault control (see Endpoints) on the node's status server.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvstore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := kvnode.Flags(fs)
	on := fs.Bool("fault-control", false, "serve fault control on the status server, for tests and demos only:\n"+Endpoints)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("kvnode: unexpected arguments %q", fs.Args())
	}
	cfg, err := config()
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	if !*on {
		return kvnode.Run(ctx, cfg, stdout, nil)
	}
	c, err := Install(&cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	return kvnode.Run(ctx, cfg, stdout, c.Attach)
}
