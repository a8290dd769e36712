package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// ServerTLSConfig returns a TLS 1.3 configuration for a node's gRPC server
// presenting cert. With clientCAs set, it is mutual TLS: every client must
// present a certificate signed by one of clientCAs; with nil, clients are
// not authenticated by TLS.
func ServerTLSConfig(cert tls.Certificate, clientCAs *x509.CertPool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if clientCAs != nil {
		c.ClientCAs = clientCAs
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c
}

// ClientTLSConfig returns a TLS 1.3 configuration for calls to nodes whose
// certificates roots signed (nil: the system roots). cert, when not nil, is
// presented to servers that require mutual TLS.
//
// ServerName is left empty, so each connection checks the server's
// certificate against the host of the member address it dials: a node's
// certificate must name its Config.ServiceAddr host (an IP SAN when the
// address is an IP).
func ClientTLSConfig(roots *x509.CertPool, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// ServerCredentials returns the server option serving TLS with cfg (for
// example from ServerTLSConfig).
func ServerCredentials(cfg *tls.Config) grpc.ServerOption {
	return grpc.Creds(credentials.NewTLS(cfg))
}

// ClientCredentials returns the dial option calling over TLS with cfg (for
// example from ClientTLSConfig); put it in RouterConfig.DialOptions.
func ClientCredentials(cfg *tls.Config) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// MinClientPing is the shortest client keepalive interval gRPC allows; it
// raises shorter ones to it.
const MinClientPing = 10 * time.Second

// Keepalive pairs the client and server keepalive settings so that servers
// accept the clients' pings. A gRPC server closes a connection (GOAWAY
// "too_many_pings") whose client pings more often than the server's
// MinTime, which is 5 minutes by default: a client pinging every 30 s
// against a server left at gRPC's defaults is cut off. Configure both sides
// from one Keepalive.
type Keepalive struct {
	// ClientTime is how long a client connection stays silent before the
	// client pings. It must be at least ServerMinTime and MinClientPing.
	// Default 30 s. Shorter detects dead connections (a crashed owner's
	// half-open socket) sooner and costs more pings.
	ClientTime time.Duration
	// ClientTimeout is how long a client waits for a ping's answer before
	// closing the connection. Default 10 s.
	ClientTimeout time.Duration
	// ServerMinTime is the shortest ping interval the server tolerates
	// from a client. Default 20 s.
	ServerMinTime time.Duration
	// ServerTime is how long a server connection stays silent before the
	// server pings. Default 1 minute.
	ServerTime time.Duration
	// ServerTimeout is how long a server waits for a ping's answer.
	// Default 10 s.
	ServerTimeout time.Duration
	// PermitWithoutStream lets clients ping, and servers accept pings, on
	// connections with no call in flight: member connections are often idle
	// between calls and should stay checked. DefaultKeepalive sets it.
	PermitWithoutStream bool
}

// DefaultKeepalive returns the settings described on Keepalive's fields.
func DefaultKeepalive() Keepalive {
	return Keepalive{
		ClientTime:          30 * time.Second,
		ClientTimeout:       10 * time.Second,
		ServerMinTime:       20 * time.Second,
		ServerTime:          time.Minute,
		ServerTimeout:       10 * time.Second,
		PermitWithoutStream: true,
	}
}

// Validate reports whether servers configured by k accept the pings of
// clients configured by k. It does not change k.
func (k Keepalive) Validate() error {
	switch {
	case k.ClientTime <= 0 || k.ClientTimeout <= 0 || k.ServerMinTime <= 0 || k.ServerTime <= 0 || k.ServerTimeout <= 0:
		return errors.New("transport: Keepalive durations must be positive")
	case k.ClientTime < MinClientPing:
		return errors.New("transport: Keepalive.ClientTime is below gRPC's 10 s minimum")
	case k.ClientTime < k.ServerMinTime:
		return errors.New("transport: Keepalive.ClientTime is below ServerMinTime: servers would close the clients' connections")
	}
	return nil
}

// ServerOptions returns the server's keepalive options.
func (k Keepalive) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             k.ServerMinTime,
			PermitWithoutStream: k.PermitWithoutStream,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: k.ServerTime, Timeout: k.ServerTimeout}),
	}
}

// DialOptions returns the client's keepalive option.
func (k Keepalive) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time:                k.ClientTime,
		Timeout:             k.ClientTimeout,
		PermitWithoutStream: k.PermitWithoutStream,
	})}
}
