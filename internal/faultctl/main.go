package faultctl

import (
	"context"
	"flag"
	"io"

	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
)

// Main is kvnode.Main with one flag more, -fault-control, which installs
// the fault control (see Endpoints) on the node's status server.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvstore", flag.ContinueOnError)
	on := fs.Bool("fault-control", false, "serve fault control on the status server, for tests and demos only:\n"+Endpoints)
	cfg, err := kvnode.Parse(fs, args, stderr)
	if err != nil {
		return err
	}
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
