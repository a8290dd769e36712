package natssource_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenure-go/tenure/coordinator/worker/natssource"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
)

// Validate refuses a config without its required parts, and New with it.
func TestConfigValidate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := newBroker(t, ctx, 4, 2)
	good := natssource.Config{Stream: b.stream, Prefix: b.prefix, DB: b.db, Fence: b.fence, Offsets: b.offsets,
		Apply: func(context.Context, sqlfence.Tx, uint32, []jetstream.Msg) error { return nil }}
	if err := good.Validate(); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	for name, mutate := range map[string]func(*natssource.Config){
		"no stream":        func(c *natssource.Config) { c.Stream = nil },
		"no prefix":        func(c *natssource.Config) { c.Prefix = "" },
		"no db":            func(c *natssource.Config) { c.DB = nil },
		"no fence":         func(c *natssource.Config) { c.Fence = nil },
		"no offsets":       func(c *natssource.Config) { c.Offsets = nil },
		"no apply":         func(c *natssource.Config) { c.Apply = nil },
		"negative batch":   func(c *natssource.Config) { c.Batch = -1 },
		"negative timeout": func(c *natssource.Config) { c.RequestTimeout = -time.Second },
	} {
		c := good
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("%s: Validate = nil", name)
		}
		if _, err := natssource.New(c); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// SubjectOf is Subject of ring.PartitionString's partition.
func TestSubjectOf(t *testing.T) {
	for _, key := range []string{"", "a", "customer-42", "key-7"} {
		for _, n := range []int{1, 7, 64} {
			if got, want := natssource.SubjectOf("orders", key, n), natssource.Subject("orders", ring.PartitionString(key, n)); got != want {
				t.Errorf("SubjectOf(%q, %d) = %s, want %s", key, n, got, want)
			}
		}
	}
	if got := natssource.Subject("orders", 12); got != "orders.12" {
		t.Errorf("Subject(orders, 12) = %s", got)
	}
}
