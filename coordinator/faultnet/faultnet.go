// Package faultnet forwards to package faultnet in transport/faultnet, where
// the fault-injecting memberlist transport now lives: it imports nothing of
// the coordinator, and its users (cluster tests of the coordinator, of
// routing, of a fence; tenuretest.Cluster.Network) import it from there.
//
// Deprecated: import github.com/tenure-go/tenure/transport/faultnet.
package faultnet

import (
	"log/slog"
	"math/rand/v2"
	"net/netip"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/transport/faultnet"
)

// The errors of package faultnet (the same values).
//
// Deprecated: use faultnet.ErrLinkDown, faultnet.ErrClosed and
// faultnet.ErrInvalid.
var (
	ErrLinkDown = faultnet.ErrLinkDown
	ErrClosed   = faultnet.ErrClosed
	ErrInvalid  = faultnet.ErrInvalid
)

// Network is faultnet.Network.
//
// Deprecated: use faultnet.Network.
type Network = faultnet.Network

// Option is faultnet.Option.
//
// Deprecated: use faultnet.Option.
type Option = faultnet.Option

// Transport is faultnet.Transport.
//
// Deprecated: use faultnet.Transport.
type Transport = faultnet.Transport

// TransportConfig is faultnet.TransportConfig.
//
// Deprecated: use faultnet.TransportConfig.
type TransportConfig = faultnet.TransportConfig

// Filter is faultnet.Filter.
//
// Deprecated: use faultnet.Filter.
type Filter = faultnet.Filter

// New is faultnet.New.
//
// Deprecated: use faultnet.New.
func New(opts ...Option) *Network { return faultnet.New(opts...) }

// WithSeed is faultnet.WithSeed.
//
// Deprecated: use faultnet.WithSeed.
func WithSeed(seed uint64) Option { return faultnet.WithSeed(seed) }

// WithRand is faultnet.WithRand.
//
// Deprecated: use faultnet.WithRand.
func WithRand(src rand.Source) Option { return faultnet.WithRand(src) }

// NewFilter is faultnet.NewFilter.
//
// Deprecated: use faultnet.NewFilter.
func NewFilter(inner *memberlist.NetTransport, blocked func(peer netip.AddrPort) bool) *Filter {
	return faultnet.NewFilter(inner, blocked)
}

// Bind is faultnet.Bind.
//
// Deprecated: use faultnet.Bind.
func Bind(host string, port int, logger *slog.Logger) (*memberlist.NetTransport, error) {
	return faultnet.Bind(host, port, logger)
}
