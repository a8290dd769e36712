package leakcheck

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
)

func TestMain(m *testing.M) { VerifyTestMain(m) }

// leftOver blocks until stop is closed.
func leftOver(stop <-chan struct{}) { <-stop }

// Negative control: a goroutine that is still running when Find looks is
// reported, with its function, once the bound has passed.
func TestFindSeesALeftOverGoroutine(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	go leftOver(stop)
	w := Wait{Own: 100 * time.Millisecond, Upstream: 200 * time.Millisecond}
	err := w.Find()
	if err == nil {
		t.Fatal("Find found nothing while a goroutine was left running")
	}
	if !strings.Contains(err.Error(), "leakcheck.leftOver") {
		t.Fatalf("Find's error does not name the left-over goroutine:\n%v", err)
	}
}

// A goroutine that ends within the bound is waited for, not reported.
func TestFindWaitsForAGoroutineThatEnds(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		leftOver(stop)
	}()
	time.AfterFunc(300*time.Millisecond, func() { close(stop) })
	if err := (Wait{Own: 10 * time.Second, Upstream: 10 * time.Second}).Find(); err != nil {
		t.Fatalf("Find reported a goroutine that ended within the bound: %v", err)
	}
	<-done
}

// Negative control with the real thing: a started coordinator left
// running (memberlist's goroutines among its own) is reported, and once it
// is closed nothing is.
func TestFindSeesAMemberlistLeftRunning(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := coordinator.LocalConfig()
	cfg.Name = "leaky"
	cfg.Ring.Partitions = 8
	cfg.Handler = coordinator.HandlerFuncs{}
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w := Wait{Own: 200 * time.Millisecond, Upstream: 400 * time.Millisecond}
	err = w.Find()
	if err == nil {
		c.Close()
		t.Fatal("Find found nothing while a coordinator was running")
	}
	if !strings.Contains(err.Error(), "github.com/hashicorp/memberlist") {
		t.Errorf("Find's error names no memberlist goroutine:\n%v", err)
	}
	c.Close()
	if err := Find(); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}
