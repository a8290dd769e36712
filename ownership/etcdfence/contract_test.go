package etcdfence_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/etcdfence"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// TestContract runs the fence contract suite against the etcd fence and
// its authority, each test under a key prefix of its own.
func TestContract(t *testing.T) {
	fencetest.Run(t, fencetest.Config{
		New: func(t testing.TB) fencetest.Subject { return etcdSubject(t, etcdfence.Config{}) },
		NewKeyed: func(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
			return etcdSubject(t, etcdfence.Config{Verifier: keys, Signer: keys})
		},
		Strict: true,
	})
}

// etcdSubject is a fence under a fresh prefix, writing its keys under the
// test's data prefix.
func etcdSubject(t testing.TB, cfg etcdfence.Config) fencetest.Subject {
	c, f, data := setup(t, cfg)
	return fencetest.Subject{
		Fence:   f,
		Current: f.Current,
		Write: func(ctx context.Context, tk ownership.Token, m ownership.Mode, k, v string) error {
			_, err := f.Do(ctx, tk, m, clientv3.OpPut(data+k, v))
			return err
		},
		Read: func(ctx context.Context, k string) (string, error) {
			resp, err := c.Get(ctx, data+k)
			if err != nil || len(resp.Kvs) == 0 {
				return "", err
			}
			return string(resp.Kvs[0].Value), nil
		},
		Authority: f.Authority(),
	}
}
