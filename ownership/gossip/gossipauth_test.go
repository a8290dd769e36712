package gossip

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

func TestGossipAuthorityClaim(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	reg, _ := NewRegister(4)
	a, err := NewAuthority(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	n1 := ownership.Node{Name: "n1", Incarnation: 11}
	n2 := ownership.Node{Name: "n2", Incarnation: 22}

	tok, err := a.Claim(ctx, 2, n1, ownership.Token{})
	if want := (ownership.Token{Partition: 2, Epoch: 1, Owner: "n1", Incarnation: 11}); err != nil || tok != want {
		t.Fatalf("first claim = %v, %v; want %v", tok, err, want)
	}
	if reg.GetClaim(2) != (Claim{Token: tok}) {
		t.Fatalf("claim not recorded: %v", reg.GetClaim(2))
	}
	// Gossip heard a higher epoch: the next claim goes above it.
	reg.Observe(ownership.Token{Partition: 2, Epoch: 7, Owner: "n3", Incarnation: 3})
	if tok, err = a.Claim(ctx, 2, n2, ownership.Token{}); err != nil || tok.Epoch != 8 || tok.Node() != n2 {
		t.Fatalf("claim after gossip = %v, %v", tok, err)
	}
	// A fence answered with a higher mark: max(gossip, mark) + 1.
	mark := ownership.Token{Partition: 2, Epoch: 20, Owner: "n9"}
	if tok, err = a.Claim(ctx, 2, n1, mark); err != nil || tok.Epoch != 21 {
		t.Fatalf("claim after a stale answer = %v, %v", tok, err)
	}
	if reg.Get(2) != tok {
		t.Fatalf("register holds %v, want %v", reg.Get(2), tok)
	}
	// A lower seen token changes nothing.
	if tok, err = a.Claim(ctx, 2, n2, ownership.Token{Partition: 2, Epoch: 1}); err != nil || tok.Epoch != 22 {
		t.Fatalf("claim with a low seen = %v, %v", tok, err)
	}
	// Partitions are independent.
	if tok, err = a.Claim(ctx, 0, n1, ownership.Token{}); err != nil || tok.Epoch != 1 {
		t.Fatalf("claim of partition 0 = %v, %v", tok, err)
	}
}

func TestGossipAuthorityBadInput(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	reg, _ := NewRegister(4)
	a, _ := NewAuthority(reg, nil)
	n := ownership.Node{Name: "n", Incarnation: 1}
	if _, err := NewAuthority(nil, nil); err == nil {
		t.Error("nil register accepted")
	}
	if _, err := a.Claim(ctx, 4, n, ownership.Token{}); !errors.Is(err, ownership.ErrPartitionRange) {
		t.Errorf("partition out of range: %v", err)
	}
	if _, err := a.Claim(ctx, 1, ownership.Node{}, ownership.Token{}); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := a.Claim(ctx, 1, ownership.Node{Name: strings.Repeat("x", ownership.MaxOwnerSize+1)}, ownership.Token{}); err == nil {
		t.Error("long name accepted")
	}
	if _, err := a.Claim(ctx, 1, n, ownership.Token{Partition: 2, Epoch: 5}); err == nil {
		t.Error("seen token of another partition accepted")
	}
	if _, err := a.Claim(ctx, 1, n, ownership.Token{Partition: 1, Epoch: math.MaxUint64}); err == nil {
		t.Error("exhausted epoch accepted")
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.Claim(done, 1, n, ownership.Token{}); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: %v", err)
	}
	if reg.Len() != 0 {
		t.Errorf("failed claims recorded: %d", reg.Len())
	}
}

func TestGossipAuthoritySigns(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	k, _ := ownership.NewKeyring(macTestKey(5))
	reg, _ := NewRegister(1)
	a, _ := NewAuthority(reg, k)
	tok, err := a.Claim(ctx, 0, ownership.Node{Name: "n", Incarnation: 1}, ownership.Token{})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Verify(tok); err != nil {
		t.Fatalf("minted token does not verify: %v", err)
	}
	if reg.Get(0) != tok {
		t.Fatalf("register holds %v, want the signed %v", reg.Get(0), tok)
	}
	// The fence accepts it.
	f, _ := ownership.NewMemoryFenceConfig(ownership.MemoryFenceConfig{Partitions: 1, Keyring: k})
	if _, err := f.Fence(ctx, tok); err != nil {
		t.Fatal(err)
	}
}

// Concurrent claims on one authority get distinct, dense epochs.
func TestGossipAuthorityConcurrent(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	const goroutines, each = 8, 200
	reg, _ := NewRegister(2)
	a, _ := NewAuthority(reg, nil)
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				tok, err := a.Claim(ctx, 1, ownership.Node{Name: "n", Incarnation: uint64(g)}, ownership.Token{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[tok.Epoch] {
					t.Errorf("epoch %d minted twice", tok.Epoch)
				}
				seen[tok.Epoch] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got := reg.Get(1).Epoch; got != goroutines*each || len(seen) != goroutines*each {
		t.Fatalf("highest epoch %d, %d distinct; want %d", got, len(seen), goroutines*each)
	}
}
