package etcdfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaultEndpoints is the local test server that .ci/etcd starts.
const defaultEndpoints = "127.0.0.1:2379"

// endpoints returns the etcd endpoints of the test server:
// TENURE_ETCD_ENDPOINTS (comma-separated), or 127.0.0.1:2379.
func endpoints() (eps []string, source string) {
	if s := os.Getenv("TENURE_ETCD_ENDPOINTS"); s != "" {
		return strings.Split(s, ","), "TENURE_ETCD_ENDPOINTS"
	}
	return []string{defaultEndpoints}, defaultEndpoints + " (set TENURE_ETCD_ENDPOINTS to use another server)"
}

// connect returns a client of the etcd test server, closed when the test
// ends. It fails the test, never skips it, if the server does not answer.
func connect(t testing.TB) *clientv3.Client {
	t.Helper()
	eps, source := endpoints()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", source, err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "tenure-test/ping"); err != nil {
		t.Fatalf("etcd at %s is unreachable; the test needs a server: %v", source, err)
	}
	return c
}

// uniquePrefix returns a key prefix no other test uses, and deletes every
// key under it when the test ends.
func uniquePrefix(t testing.TB, c *clientv3.Client) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	prefix := "tenure-test/" + hex.EncodeToString(b[:]) + "/"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
			t.Errorf("delete %s: %v", prefix, err)
		}
	})
	return prefix
}

// setup returns a client, a fence under a fresh prefix (marks under
// prefix+"fence/") and the prefix for the test's data.
func setup(t testing.TB, cfg etcdfence.Config) (*clientv3.Client, *etcdfence.Fence, string) {
	t.Helper()
	c := connect(t)
	prefix := uniquePrefix(t, c)
	cfg.Prefix = prefix + "fence/"
	f, err := etcdfence.New(c, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, f, prefix + "data/"
}

func mustFence(t testing.TB, f *etcdfence.Fence, tk ownership.Token) {
	t.Helper()
	if got, err := f.Fence(testkit.Ctx(t, 60*time.Second), tk); err != nil || !got.Same(tk) {
		t.Fatalf("Fence(%v) = %v, %v", tk, got, err)
	}
}

// get returns the value of key, "" if it does not exist.
func get(t testing.TB, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(testkit.Ctx(t, 60*time.Second), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}
