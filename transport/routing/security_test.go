package routing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/transport"
)

// testPKI is a CA and the certificates it signed.
type testPKI struct {
	pool   *x509.CertPool
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newTestPKI(t *testing.T) *testPKI {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tenure test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testPKI{pool: pool, caCert: cert, caKey: key}
}

func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage, ips ...net.IP) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	serverCert := pki.issue(t, "node", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	clientCert := pki.issue(t, "client", x509.ExtKeyUsageClientAuth)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lease := liveLease(t)
	leases := &fakeLeases{lease: func([]byte) (*ownership.Lease, error) { return lease, nil }}
	g, err := NewGuard(GuardConfig{Leases: leases, Stale: leases})
	if err != nil {
		t.Fatal(err)
	}
	ka := transport.DefaultKeepalive()
	opts := append(g.ServerOptions(), transport.ServerCredentials(transport.ServerTLSConfig(serverCert, pki.pool)))
	srv := grpc.NewServer(append(opts, ka.ServerOptions()...)...)
	srv.RegisterService(&kvDesc, &kv{name: "node"})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	router := func(cfg *tls.Config) *Router {
		owners := &fakeOwners{addr: lis.Addr().String()}
		r, err := NewRouter(RouterConfig{
			Owners:      owners,
			Membership:  owners,
			DialOptions: append(ka.DialOptions(), transport.ClientCredentials(cfg)),
			MaxAttempts: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	ctx := testkit.Ctx(t, 10*time.Second)
	if got, err := put(ctx, router(transport.ClientTLSConfig(pki.pool, &clientCert)), "k"); err != nil || got != "node" {
		t.Fatalf("mTLS call: %q %v", got, err)
	}
	if _, err := put(ctx, router(transport.ClientTLSConfig(pki.pool, nil)), "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("call without a client certificate: %v", err)
	}
	if _, err := put(ctx, router(transport.ClientTLSConfig(x509.NewCertPool(), &clientCert)), "k"); status.Code(err) != codes.Unavailable {
		t.Fatalf("call to an untrusted server: %v", err)
	}
	if c := transport.ServerTLSConfig(serverCert, nil); c.ClientAuth != tls.NoClientCert || c.MinVersion != tls.VersionTLS13 {
		t.Fatal("server-only TLS asks for client certificates")
	}
}
