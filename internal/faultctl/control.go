// Package faultctl is the fault control of the kvstore example's nodes, for
// tests and demos only: a cut of chosen peers (gossip and gRPC) and a hold
// of one write at the worst moment, set through a node's status server.
// It lives apart from examples/kvstore/kvnode, the package users copy, and
// plugs into a node through kvnode.Config's hooks (the gossip transport,
// DialOptions, WriteHook, StatusHandlers).
//
// Anyone who reaches a status server with fault control can partition the
// cluster: never turn it on in production.
package faultctl

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/kvstore/kvnode"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport/faultnet"
	"google.golang.org/grpc"
)

// Endpoints is what Control serves on the node's status server, as the
// -fault-control flag's help lists it.
const Endpoints = `POST /debug/cut?peers=IP:PORT,...  cut this node off from those gossip addresses (and their gRPC); no peers heals
POST /debug/hold?partition=N        hold the next write to partition N after the gate, before the database
GET  /debug/hold?partition=N        {"waiting": true} once a write waits at N's hold
POST /debug/release?partition=N     let the held write go on (under its old token)`

// Control is the fault control of one node. It is safe for concurrent use.
type Control struct {
	log    *slog.Logger
	cut    *cutSet
	holds  *holdSet
	gossip *faultnet.Filter
	node   atomic.Pointer[kvnode.Node]
}

// Install builds the fault control for cfg and plugs it in: it binds the
// node's gossip transport (a faultnet.Filter at cfg.GossipAddr), adds the
// router's dialer, the write hook and the status handlers. Call Attach
// once the node has started, and Close after it has stopped.
func Install(cfg *kvnode.Config) (*Control, error) {
	c := &Control{log: slog.New(slog.DiscardHandler), cut: newCutSet(), holds: newHoldSet()}
	if cfg.Logger != nil {
		c.log = cfg.Logger.With("node", cfg.Name)
	}
	addr := cfg.GossipAddr
	if addr == "" {
		addr = "127.0.0.1:7946" // kvnode's default
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, errors.New("faultctl: the gossip address must be a literal ip:port, not " + addr)
	}
	inner, err := faultnet.Bind(ap.Addr().String(), int(ap.Port()), cfg.Logger)
	if err != nil {
		return nil, err
	}
	c.gossip = faultnet.NewFilter(inner, c.cut.blocked)
	if cfg.Coordinator.Memberlist == nil {
		cfg.Coordinator = coordinator.LANConfig() // kvnode's default
	}
	ml := *cfg.Coordinator.Memberlist // a copy: the caller's preset is not changed
	ml.Transport = c.gossip
	cfg.Coordinator.Memberlist = &ml
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithContextDialer(c.cut.dial))
	cfg.WriteHook = c.writeHook
	if cfg.StatusHandlers == nil {
		cfg.StatusHandlers = map[string]http.Handler{}
	}
	for pattern, h := range c.handlers() {
		cfg.StatusHandlers[pattern] = h
	}
	return c, nil
}

// Attach tells the control which node it serves (Cut reads its members).
func (c *Control) Attach(n *kvnode.Node) { c.node.Store(n) }

// Close lets every held write go on and closes the gossip transport, if
// memberlist has not.
func (c *Control) Close() {
	c.holds.close()
	_ = c.gossip.Shutdown()
}

// writeHook is the node's kvnode.Config.WriteHook: the hold.
func (c *Control) writeHook(ctx context.Context, t ownership.Token) (context.Context, func()) {
	ctx, cancel := c.holds.wait(ctx, t.Partition)
	return ctx, cancel
}

// Cut cuts the node off from the peers at the given gossip addresses
// (ip:port), replacing any earlier cut; no peers heals it. From then on the
// node drops the gossip packets to and from those peers, fails its gossip
// dials to them, and its router refuses to connect to their gRPC
// addresses (as the members' metadata gave them when Cut was called). The
// cut lives in the node's own transport, not in the kernel: accepted
// gossip streams and inbound gRPC calls can't be attributed to a peer and
// pass, so cut both ends of a link. Heal, and the coordinators re-join
// each other within their RejoinInterval.
func (c *Control) Cut(peers []string) error {
	gossip := make([]netip.AddrPort, 0, len(peers))
	cut := map[netip.AddrPort]bool{}
	for _, p := range peers {
		a, err := parseGossipAddr(p)
		if err != nil {
			return err
		}
		gossip = append(gossip, a)
		cut[a] = true
	}
	var service []string
	if n := c.node.Load(); n != nil {
		for _, m := range n.Coordinator().Members() {
			if a, err := parseGossipAddr(m.GossipAddr); err == nil && cut[a] && m.ServiceAddr != "" {
				service = append(service, m.ServiceAddr)
			}
		}
	}
	c.cut.set(gossip, service)
	c.log.Warn("fault control: cut", "gossip", peers, "grpc", service)
	return nil
}

// Hold makes the next write to partition p wait, after it has passed the
// partition's gate with its lease's token and before it reaches the
// database, until Release(p) or Close. Released, it goes on even if its
// lease ended meanwhile, as a write already on the wire would: only the
// fence can stop it.
func (c *Control) Hold(p uint32) {
	c.holds.arm(p)
	c.log.Warn("fault control: hold the next write", "partition", p)
}

// Holding reports whether a write waits at partition p's hold.
func (c *Control) Holding(p uint32) bool { return c.holds.waiting(p) }

// Release lets the write held at partition p go on.
func (c *Control) Release(p uint32) {
	c.holds.release(p)
	c.log.Warn("fault control: release the held write", "partition", p)
}

// handlers are the endpoints listed in Endpoints.
func (c *Control) handlers() map[string]http.Handler {
	answer := func(w http.ResponseWriter, err error, v any) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	partition := func(w http.ResponseWriter, r *http.Request, then func(p uint32)) {
		p, err := strconv.ParseUint(r.URL.Query().Get("partition"), 10, 32)
		if err != nil {
			http.Error(w, "faultctl: want ?partition=N", http.StatusBadRequest)
			return
		}
		then(uint32(p))
	}
	return map[string]http.Handler{
		"POST /debug/cut": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peers := splitPeers(r.URL.Query().Get("peers"))
			answer(w, c.Cut(peers), map[string][]string{"cut": peers})
		}),
		"POST /debug/hold": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			partition(w, r, func(p uint32) { c.Hold(p); answer(w, nil, map[string]uint32{"held": p}) })
		}),
		"GET /debug/hold": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			partition(w, r, func(p uint32) { answer(w, nil, map[string]bool{"waiting": c.Holding(p)}) })
		}),
		"POST /debug/release": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			partition(w, r, func(p uint32) { c.Release(p); answer(w, nil, map[string]uint32{"released": p}) })
		}),
	}
}
