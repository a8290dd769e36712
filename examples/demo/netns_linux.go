package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-go/tenure/internal/netdelay"
	"github.com/tenure-go/tenure/internal/netns"
)

// dbNode is the database's place on the network: a relay to PostgreSQL on
// the host's loopback, which a cut reaches like any node.
const dbNode = "db"

// nsNet puts every node in a network namespace of its own (-netns): a cut
// is nftables rules that drop gossip, gRPC and the database's traffic
// alike, instead of the nodes dropping gossip themselves.
type nsNet struct {
	n     *netns.Net
	relay *netdelay.Proxy
	dsn   string // the nodes' DSN: the relay's address
}

// openNet builds the network of the nodes named names and the database
// relay to dsn's server.
func openNet(names []string, dsn string) (*nsNet, error) {
	if dsn == "" {
		return nil, fmt.Errorf("-netns needs -dsn: a cut must reach the database, and a SQLite file is shared through the file system")
	}
	pg, err := pgx.ParseConfig(dsn)
	u, uerr := url.Parse(dsn)
	if err != nil || uerr != nil || u.Host == "" {
		return nil, fmt.Errorf("-netns needs -dsn as a postgres:// URL")
	}
	n, err := netns.New(append(names, dbNode)...)
	if err != nil {
		return nil, err
	}
	s := &nsNet{n: n}
	if s.relay, err = n.Relay(dbNode, fmt.Sprintf("%s:%d", pg.Host, pg.Port), 0); err != nil {
		n.Close()
		return nil, err
	}
	u.Host = s.relay.Addr()
	s.dsn = u.String()
	return s, nil
}

// host is the address node listens on.
func (s *nsNet) host(node string) string { return s.n.Addr(node).String() }

// command runs self with args in node's namespace.
func (s *nsNet) command(node, self string, args ...string) *exec.Cmd {
	return s.n.Command(node, self, args...)
}

// cut separates a from b and the database; no a heals every cut.
func (s *nsNet) cut(a, b []*proc) error {
	if len(a) == 0 {
		return s.n.Heal()
	}
	return s.n.Partition(procNames(a), append(procNames(b), dbNode))
}

func (s *nsNet) close() error {
	return errors.Join(s.relay.Close(), s.n.Close())
}

// procNames returns the names of ps.
func procNames(ps []*proc) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.name)
	}
	return out
}

// verifyCut checks the cut a | b at the network, from inside the
// namespaces: a's first node can dial neither the database nor b's first
// node's gRPC port, while b's first node still dials the database.
func (s *nsNet) verifyCut(a, b []*proc) error {
	dial := func(from *proc, addr string, timeout time.Duration) error {
		return s.n.Do(from.name, func() error {
			c, err := net.DialTimeout("tcp", addr, timeout)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	// Short where a dial must fail (a dropped SYN only ever times out),
	// long where it must work.
	if dial(a[0], s.relay.Addr(), 500*time.Millisecond) == nil {
		return fmt.Errorf("%s reached the database across the cut", a[0].name)
	}
	if dial(a[0], b[0].grpcAddr, 500*time.Millisecond) == nil {
		return fmt.Errorf("%s reached %s's gRPC across the cut", a[0].name, b[0].name)
	}
	if err := dial(b[0], s.relay.Addr(), 10*time.Second); err != nil {
		return fmt.Errorf("%s, on the database's side of the cut, can't reach it: %w", b[0].name, err)
	}
	return nil
}

// lossy drops 20% of the packets reaching lossy and every packet from
// from to to (one way).
func (s *nsNet) lossy(lossy, from, to string) error {
	if err := s.n.Loss(lossy, 20); err != nil {
		return err
	}
	return s.n.Cut(from, to)
}
