package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"

	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

// ownerJSON is one key's owner, as -json prints it.
type ownerJSON struct {
	Key       string `json:"key"`
	Partition uint32 `json:"partition"`
	Owner     string `json:"owner"`
	Address   string `json:"address"`
	Epoch     uint64 `json:"epoch"`
	Token     string `json:"token"`
}

// owner prints the owner of each key.
func (c *cli) owner(ctx context.Context, args []string) error {
	var isHex bool
	fs, err := subFlags("owner", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&isHex, "hex", false, "the keys are hex-encoded bytes")
	})
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: give at least one key", errUsage)
	}
	var rows []ownerJSON
	for _, k := range fs.Args() {
		key := []byte(k)
		if isHex {
			if key, err = hex.DecodeString(k); err != nil {
				return fmt.Errorf("%w: key %q is not hex: %v", errUsage, k, err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		resp, err := c.client.Lookup(cctx, &pb.LookupRequest{Key: key})
		cancel()
		if err != nil {
			return c.callError(fmt.Sprintf("lookup of %q", k), err)
		}
		rows = append(rows, ownerJSON{Key: k, Partition: resp.GetPartition(), Owner: resp.GetOwner(),
			Address: resp.GetAddress(), Epoch: resp.GetEpoch(), Token: resp.GetToken()})
	}
	if c.json {
		return printJSON(c.out, map[string]any{"owners": rows})
	}
	t := newTable(c.out, "KEY", "PARTITION", "OWNER", "ADDRESS", "EPOCH")
	for _, r := range rows {
		epoch := fmt.Sprint(r.Epoch)
		if r.Epoch == 0 {
			epoch = "- (moving)"
		}
		t.row(r.Key, fmt.Sprint(r.Partition), r.Owner, r.Address, epoch)
	}
	return t.flush()
}
