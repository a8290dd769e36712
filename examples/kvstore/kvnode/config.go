package kvnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"google.golang.org/grpc"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/ownership"
)

// Config configures a node. The flags of Main fill one.
type Config struct {
	// Name identifies the node in the cluster: unique, stable across
	// restarts. Required.
	Name string
	// GossipAddr is where gossip binds, host:port (UDP and TCP). Port 0
	// picks a free port; a host of 0.0.0.0 binds every interface and
	// advertises a private IP. Default "127.0.0.1:7946".
	GossipAddr string
	// GRPCAddr is where the KV service listens, host:port. Other nodes dial
	// it, so the host must be an address they can reach, not 0.0.0.0.
	// Port 0 picks a free port. Default "127.0.0.1:7947".
	GRPCAddr string
	// StatusAddr is where the HTTP status server listens (status page,
	// /metrics, /kv/stats, and StatusHandlers), host:port.
	// Empty: no status server.
	StatusAddr string
	// Seeds are gossip addresses of nodes to join. Start fails if none
	// answers; with no seeds the node starts a cluster of its own.
	Seeds []string
	// GossipKey encrypts gossip (AES, 16, 24 or 32 bytes); every node needs
	// the same key. Empty: gossip is not encrypted.
	GossipKey []byte

	// DataPath is the SQLite file every node on this machine shares.
	// Default "kvstore.db". Ignored when DSN is set.
	DataPath string
	// DSN, when set, is a PostgreSQL connection string (pgx), for nodes on
	// several machines. For example
	// "postgres://user@db:5432/kv?sslmode=disable".
	DSN string

	// Coordinator holds the coordinator's settings: a preset
	// (coordinator.LocalConfig, LANConfig) with any timing or Ring changed.
	// Start sets its Name, addresses, Seeds, GossipKeys, Handler, Fence,
	// Authority and Logger from the other fields. When its Memberlist is nil
	// (the zero Config), coordinator.LANConfig() is used.
	Coordinator coordinator.Config

	// DialOptions are added to the options of the connections this node
	// makes to the others (its router's): TLS credentials, a dialer.
	// Default: none (plain TCP, keepalive on).
	DialOptions []grpc.DialOption
	// StatusHandlers are served on the status server beside its own pages,
	// each under its pattern (http.ServeMux syntax, e.g. "POST /debug/x").
	// Default: none.
	StatusHandlers map[string]http.Handler
	// WriteHook, when set, is called by the owner for every write after it
	// entered the partition's gate and before its fenced transaction, with
	// the lease's token; the write then runs under the context it returns,
	// and the returned function is called when the write is done. It is for
	// fault injection in tests and demos (holding a write at the worst
	// moment); leave it nil otherwise.
	WriteHook func(ctx context.Context, t ownership.Token) (context.Context, func())

	// Logger receives the node's and the coordinator's logs. Default:
	// discard.
	Logger *slog.Logger
}

// withDefaults returns c with the defaults filled in, or its first problem.
func (c Config) withDefaults() (Config, error) {
	if c.GossipAddr == "" {
		c.GossipAddr = "127.0.0.1:7946"
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:7947"
	}
	if c.DataPath == "" {
		c.DataPath = "kvstore.db"
	}
	if c.Coordinator.Memberlist == nil {
		c.Coordinator = coordinator.LANConfig()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Name == "" {
		return c, errors.New("kvnode: Config.Name is empty")
	}
	if _, _, err := splitHostPort(c.GossipAddr); err != nil {
		return c, fmt.Errorf("kvnode: Config.GossipAddr: %w", err)
	}
	host, _, err := splitHostPort(c.GRPCAddr)
	if err != nil {
		return c, fmt.Errorf("kvnode: Config.GRPCAddr: %w", err)
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return c, fmt.Errorf("kvnode: Config.GRPCAddr %q: other nodes dial it, so give an address they can reach, not %q", c.GRPCAddr, host)
	}
	if c.StatusAddr != "" {
		if _, _, err := splitHostPort(c.StatusAddr); err != nil {
			return c, fmt.Errorf("kvnode: Config.StatusAddr: %w", err)
		}
	}
	return c, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: bad port %q", addr, p)
	}
	return host, int(port), nil
}
