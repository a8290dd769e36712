package netdelay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves an echo server on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// through starts a proxy with delay to an echo server and dials it; both
// close when the test ends, and the connection's deadline is 30 s away.
func through(t *testing.T, delay time.Duration) (*Proxy, *net.TCPConn) {
	t.Helper()
	p, err := Start(echo(t), delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return p, c.(*net.TCPConn)
}

// TestRoundTripIsDelayed: bytes come back intact, in order, and no round
// trip through the proxy takes less than twice the delay.
func TestRoundTripIsDelayed(t *testing.T) {
	const delay = 20 * time.Millisecond
	_, c := through(t, delay)
	for i := range 5 {
		msg := bytes.Repeat([]byte{byte('a' + i)}, 1000*(i+1))
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 2*delay {
			t.Errorf("round trip %d took %v, less than twice the delay %v", i, took, delay)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("round trip %d: bytes changed", i)
		}
	}
}

// TestHalfClose: a client that sends, closes its side for writing and
// then reads gets the whole answer.
func TestHalfClose(t *testing.T) {
	_, c := through(t, time.Millisecond)
	msg := bytes.Repeat([]byte("half"), 10000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes back, want the %d sent", len(got), len(msg))
	}
}

// TestCloseEndsRelays: Close returns with a connection open, and the
// client sees it end; the leak check sees no goroutine left.
func TestCloseEndsRelays(t *testing.T) {
	p, c := through(t, time.Millisecond)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(b); err == nil {
		t.Fatal("the connection stayed open after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStartRefusesOtherHosts(t *testing.T) {
	for _, target := range []string{"10.0.0.1:5432", "example.com:80", "nonsense", "127.0.0.1:1"} {
		p, err := Start(target, time.Millisecond)
		if target == "127.0.0.1:1" {
			if err != nil {
				t.Errorf("%s: %v", target, err)
			} else {
				p.Close()
			}
			continue
		}
		if err == nil {
			p.Close()
			t.Errorf("%s: accepted", target)
		}
	}
	if _, err := Start("127.0.0.1:1", -time.Second); err == nil {
		t.Error("a negative delay was accepted")
	}
}

// Serve checks its target as Start does, and closes the caller's listener
// when it refuses one.
func TestServeRefusesOtherHostsAndClosesTheListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := Serve(ln, "10.0.0.1:5432", 0); err == nil {
		p.Close()
		t.Fatal("Serve accepted a target off loopback")
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the refused listener was not closed: Accept said %v", err)
	}
}
