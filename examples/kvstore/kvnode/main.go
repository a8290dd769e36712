package kvnode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ring"
)

// leaveTimeout bounds Main's graceful leave once its context ends.
const leaveTimeout = 15 * time.Second

// Ready is the line Main writes to stdout, as JSON, once the node serves:
//
//	{"event":"ready","name":"n1","gossip":"127.0.0.1:7946","grpc":"127.0.0.1:7947","status":"127.0.0.1:8080"}
//
// with the addresses actually bound (Status is "" without a status server).
type Ready struct {
	Event  string `json:"event"` // "ready"
	Name   string `json:"name"`
	Gossip string `json:"gossip"`
	GRPC   string `json:"grpc"`
	Status string `json:"status"`
}

// Main runs a node as the kvstore command does: it parses the flags in
// args (Parse), logs to stderr, and runs the node (Run). The environment
// variable TENURE_GOSSIP_KEY is read when -gossip-key is empty.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := Parse(flag.NewFlagSet("kvstore", flag.ContinueOnError), args, stderr)
	if err != nil {
		return err
	}
	return Run(ctx, cfg, stdout, nil)
}

// Parse defines the node's flags on fs (Flags), which may hold flags of
// the caller's too, parses args, and returns the Config, logging to
// stderr. Usage and errors go to stderr.
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer) (Config, error) {
	fs.SetOutput(stderr)
	config := Flags(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("kvnode: unexpected arguments %q", fs.Args())
	}
	cfg, err := config()
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	return cfg, err
}

// Flags defines the node's flags (see the package doc) on fs and returns
// the function that builds the Config from them once fs is parsed. A
// command may define flags of its own on fs beside them.
func Flags(fs *flag.FlagSet) func() (Config, error) {
	name := fs.String("name", "", "node name, unique in the cluster (required)")
	gossip := fs.String("gossip", "127.0.0.1:7946", "gossip bind address host:port (UDP and TCP; port 0 picks one)")
	grpcAddr := fs.String("grpc", "127.0.0.1:7947", "gRPC address host:port other nodes and clients dial (port 0 picks one)")
	status := fs.String("status", "", "HTTP status server address host:port (status page, /metrics, /kv/stats); empty disables")
	seeds := fs.String("seeds", "", "comma-separated gossip addresses of nodes to join")
	gossipKey := fs.String("gossip-key", "", "base64 AES key (16, 24 or 32 bytes) encrypting gossip; default $TENURE_GOSSIP_KEY")
	data := fs.String("data", "kvstore.db", "SQLite file shared by the nodes of this machine")
	dsn := fs.String("dsn", "", "PostgreSQL DSN; when set, used instead of -data")
	preset := fs.String("preset", "lan", "coordinator timings: local (one machine, fast) or lan")
	partitions := fs.Int("partitions", ring.DefaultConfig().Partitions, "partitions of the key space (the same on every node)")
	return func() (Config, error) {
		cfg := Config{
			Name:       *name,
			GossipAddr: *gossip,
			GRPCAddr:   *grpcAddr,
			StatusAddr: *status,
			Seeds:      splitPeers(*seeds),
			DataPath:   *data,
			DSN:        *dsn,
		}
		key := *gossipKey
		if key == "" {
			key = os.Getenv("TENURE_GOSSIP_KEY")
		}
		if key != "" {
			b, err := base64.StdEncoding.DecodeString(key)
			if err != nil {
				return cfg, fmt.Errorf("kvnode: -gossip-key: %w", err)
			}
			cfg.GossipKey = b
		}
		switch *preset {
		case "local":
			cfg.Coordinator = coordinator.LocalConfig()
		case "lan":
			cfg.Coordinator = coordinator.LANConfig()
		default:
			return cfg, fmt.Errorf("kvnode: -preset %q: want local or lan", *preset)
		}
		cfg.Coordinator.Ring.Partitions = *partitions
		return cfg, nil
	}
}

// Run starts a node for cfg, calls started (if not nil) with it, writes one
// Ready line to stdout, and serves until ctx ends; then it leaves the
// cluster (handing its partitions off, serving until its callers have
// moved) and returns nil once everything has stopped.
func Run(ctx context.Context, cfg Config, stdout io.Writer, started func(*Node)) error {
	node, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	if started != nil {
		started(node)
	}
	err = json.NewEncoder(stdout).Encode(Ready{
		Event: "ready", Name: cfg.Name,
		Gossip: node.GossipAddr(), GRPC: node.GRPCAddr(), Status: node.StatusAddr(),
	})
	if err != nil {
		node.Close()
		return fmt.Errorf("kvnode: write the ready line: %w", err)
	}

	<-ctx.Done()
	node.log.Info("leaving")
	lctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := node.Leave(lctx); err != nil && !errors.Is(err, coordinator.ErrClosed) {
		return fmt.Errorf("kvnode: leave: %w", err)
	}
	node.log.Info("stopped")
	return nil
}
