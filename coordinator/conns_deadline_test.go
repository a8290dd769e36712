package coordinator

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/tenure-go/tenure/internal/testkit"
)

// A stream this node dials ends its writes after the dial's timeout, when
// the peer accepts and never reads (a paused process): SendReliable, which
// the digest exchange's one sender uses, sets no deadline of its own, and
// a write stuck there held every exchange up until Close (found in review).
func TestDialedStreamHasADeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // held, never read
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()

	mc := memberlist.DefaultLocalConfig()
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	tr, err := newTransport(mc, nil, &traffic{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	c, err := tr.DialAddressTimeout(memberlist.Address{Addr: ln.Addr().String()}, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := c.Write(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	ctx := testkit.Ctx(t, 20*time.Second)
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("write to a peer that never reads: %v, want a deadline error", err)
		}
	case <-ctx.Done():
		c.Close()
		<-done
		t.Fatal("a write to a peer that never reads was still blocked 20 s (scaled) after a dial with a 300 ms timeout")
	}
}
