//go:build linux

package netns

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/tenure-go/tenure/internal/netdelay"
)

// Relay makes a service on the host's loopback (PostgreSQL, say) a node of
// the network, which faults can cut like any other: it listens on a free
// port of node's address, inside node's namespace, and forwards each
// connection to target, a loopback host:port dialed from the root
// namespace, with delay added to each direction (netdelay's proxy; the
// kernel here has no netem). It is the network's only way out, one port to
// one target.
func (n *Net) Relay(node, target string, delay time.Duration) (*netdelay.Proxy, error) {
	var ln net.Listener
	err := n.Do(node, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(n.Addr(node), 0).String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: relay on %s: %w", node, err)
	}
	return netdelay.Serve(ln, target, delay)
}
