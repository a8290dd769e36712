package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// moveJSON is one change of a partition's owner or token, as -json prints
// it (one object per line).
type moveJSON struct {
	Time      time.Time `json:"time"`
	Partition uint32    `json:"partition"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Address   string    `json:"address"`
	Epoch     uint64    `json:"epoch"`
	Token     string    `json:"token"`
}

// watch prints every change of a partition's owner or epoch as it
// arrives, until -for passes, -count changes were printed, the node ends
// the stream, or ctx ends.
func (c *cli) watch(ctx context.Context, args []string) error {
	var dur time.Duration
	var count int
	fs, err := subFlags("watch", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&dur, "for", 0, "stop after this long (default: until interrupted)")
		fs.IntVar(&count, "count", 0, "stop after this many changes (default: no limit)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() > 0 || dur < 0 || count < 0 {
		return fmt.Errorf("%w: watch takes -for D and -count N, nothing else", errUsage)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if dur > 0 {
		ctx, cancel = context.WithTimeout(ctx, dur)
		defer cancel()
	}
	stream, ps, err := c.openWatch(ctx)
	if err != nil {
		return err
	}
	if c.json {
		fmt.Fprintf(c.errOut, "watching %d partitions at %s\n", ps.count, c.addr)
	} else {
		fmt.Fprintf(c.out, "watching %d partitions at %s\n", ps.count, c.addr)
		fmt.Fprintf(c.out, "%-12s  %9s  %-20s  %-20s  %s\n", "TIME", "PARTITION", "FROM", "TO", "EPOCH")
	}
	seen := 0
	for count == 0 || seen < count {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil // -for passed, or interrupted
			}
			if status.Code(err) == codes.Unavailable {
				return errors.New("the node ended the watch: " + status.Convert(err).Message())
			}
			return c.callError("watch", err)
		}
		prev := map[uint32]string{}
		for _, o := range m.GetPartitions() {
			prev[o.GetPartition()] = ps.owners[o.GetPartition()].GetOwner()
		}
		restarted, err := ps.apply(m)
		if err != nil {
			return err
		}
		if restarted {
			fmt.Fprintf(c.out, "the table now has %d partitions\n", ps.count)
			continue
		}
		now := time.Now()
		for _, o := range m.GetPartitions() {
			mv := moveJSON{Time: now, Partition: o.GetPartition(), From: prev[o.GetPartition()], To: o.GetOwner(),
				Address: o.GetAddress(), Epoch: o.GetEpoch(), Token: o.GetToken()}
			if c.json {
				if err := printJSON(c.out, mv); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(c.out, "%-12s  %9d  %-20s  %-20s  %s\n", now.Format("15:04:05.000"), mv.Partition,
					printable(mv.From), printable(mv.To), epochText(mv.Epoch))
			}
			if seen++; count > 0 && seen >= count {
				break
			}
		}
	}
	return nil
}
