package ownership_test

import (
	"context"
	"sync"
	"testing"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
)

// TestMemoryFenceContract runs the fence contract suite against the
// memory fence, writing to a map under Do.
func TestMemoryFenceContract(t *testing.T) {
	fencetest.Run(t, fencetest.Config{
		New: func(t testing.TB) fencetest.Subject { return memSubject(t, nil) },
		NewKeyed: func(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
			return memSubject(t, keys)
		},
	})
}

func memSubject(t testing.TB, keys *ownership.Keyring) fencetest.Subject {
	f, err := ownership.NewMemoryFenceConfig(ownership.MemoryFenceConfig{Partitions: 16, Keyring: keys})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	data := map[string]string{}
	return fencetest.Subject{
		Fence: f,
		Current: func(_ context.Context, p uint32) (ownership.Token, error) {
			return f.Current(p), nil
		},
		Write: func(ctx context.Context, tk ownership.Token, m ownership.Mode, key, value string) error {
			return f.Do(ctx, tk, m, func() error {
				mu.Lock()
				defer mu.Unlock()
				data[key] = value
				return nil
			})
		},
		Read: func(_ context.Context, key string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return data[key], nil
		},
	}
}
