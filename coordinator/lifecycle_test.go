package coordinator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
)

// lifeDeadline bounds every lifecycle test. Their nodes get a TCPTimeout
// four times as long (slowTCP), so a Start, Join or Close that waits for a
// stuck dial or stream to time out fails the test by its deadline, and one
// that is cut short passes whatever the machine's load.
const lifeDeadline = 15 * time.Second

// slowTCP gives a node a TCPTimeout far past lifeDeadline.
func slowTCP(c *Config) {
	ml := *c.Memberlist
	ml.TCPTimeout = 4 * lifeDeadline
	c.Memberlist = &ml
}

// lifeConfig is testConfig with a handler that accepts everything.
func lifeConfig(name string) Config {
	cfg := testConfig(name)
	cfg.Handler = &gatedHandler{}
	return cfg
}

// holeSeeded is lifeConfig on a free loopback address (returned, to check
// its gossip later) with hole as its only seed and a TCPTimeout far past
// any test's deadline.
func holeSeeded(t *testing.T, name string, hole *blackHole) (Config, string, int) {
	t.Helper()
	host, port := freeAddr(t)
	cfg := lifeConfig(name)
	cfg.BindAddr, cfg.BindPort = host, port
	cfg.Seeds = []string{hole.ln.Addr().String()}
	slowTCP(&cfg)
	return cfg, host, port
}

// freeAddr returns a loopback address whose TCP and UDP ports were free a
// moment ago.
func freeAddr(t *testing.T) (string, int) {
	t.Helper()
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		ln.Close()
		if err != nil {
			continue
		}
		pc.Close()
		return "127.0.0.1", port
	}
	t.Fatal("no free port")
	return "", 0
}

// gossipStopped reports whether nothing listens any more at host:port (TCP
// and UDP): the memberlist that had it is shut down.
func gossipStopped(host string, port int) error {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("gossip TCP port still taken: %w", err)
	}
	ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("gossip UDP port still taken: %w", err)
	}
	pc.Close()
	return nil
}

// result waits for one error from ch, failing the test at ctx's end.
func result(ctx context.Context, t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		t.Fatalf("%s did not return before the test's deadline (TCPTimeout is %v)", what, 4*lifeDeadline)
		return nil
	}
}

// Close runs while Start is still joining its seeds (a service's shutdown
// signal arrives during startup): no race, no deadlock, Start returns an
// error, Close returns, and no memberlist is left running. The seed is a
// black hole, so the join hangs until Close aborts it. Close comes at three
// moments: before Start has begun, at the same time, and once the join's
// stream is open.
func TestCloseDuringStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 4*lifeDeadline)
	defer cancel()
	hole := newBlackHole(t, "127.0.0.1:0", true)
	for i := range 30 {
		ictx, icancel := context.WithTimeout(ctx, lifeDeadline)
		cfg, host, port := holeSeeded(t, fmt.Sprintf("s%d", i), hole)
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		started, closed := make(chan error, 1), make(chan error, 1)
		goClose := func() { go func() { closed <- c.Close() }() }
		k0, _ := hole.accepted()
		switch i % 3 {
		case 0: // the signal came first
			goClose()
			go func() { started <- c.Start(ictx) }()
		case 1: // together
			go func() { started <- c.Start(ictx) }()
			goClose()
		case 2: // during the join's stream
			go func() { started <- c.Start(ictx) }()
			testkit.WaitFor(ictx, t, "the join to reach the seed", func() bool {
				k, _ := hole.accepted()
				return k > k0
			})
			goClose()
		}
		if err := result(ictx, t, started, "Start"); err == nil {
			t.Fatalf("run %d: Start with Close during its join returned nil", i)
		} else if !errors.Is(err, ErrClosed) {
			t.Fatalf("run %d: Start with Close during its join returned %v, want ErrClosed", i, err)
		}
		if err := result(ictx, t, closed, "Close"); err != nil {
			t.Fatalf("run %d: Close returned %v", i, err)
		}
		if err := gossipStopped(host, port); err != nil {
			t.Fatalf("run %d: after Start and Close returned: %v", i, err)
		}
		icancel()
	}
}

// Start's context bounds its join: a seed that never answers makes Start
// return ctx's error at ctx's end, not at memberlist's TCPTimeout, and the
// coordinator is closed (gossip stopped).
func TestStartReturnsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	hole := newBlackHole(t, "127.0.0.1:0", true)
	cfg, host, port := holeSeeded(t, "sctx", hole)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sctx, scancel := context.WithCancel(ctx)
	started := make(chan error, 1)
	go func() { started <- c.Start(sctx) }()
	testkit.WaitFor(ctx, t, "the join to reach the seed", func() bool {
		k, _ := hole.accepted()
		return k > 0
	})
	scancel()
	if err := result(ctx, t, started, "Start"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start whose context ended during the join returned %v, want context.Canceled", err)
	}
	if err := gossipStopped(host, port); err != nil {
		t.Fatalf("after a failed Start: %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after a failed Start returned %v, want ErrClosed", err)
	}
}

// fullBacklog returns a loopback TCP listener whose accept queue is full:
// the kernel drops every further SYN, so a dial to it stays in progress
// (SYN_SENT) until its timeout. It is Linux's behaviour for a listener
// that has stopped accepting; elsewhere the test fails rather than skip.
func fullBacklog(ctx context.Context, t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Fatalf("%s: this test needs Linux's accept-queue overflow and /proc/net/tcp (CI runs on Linux)", runtime.GOOS)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "backlog")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var fill []net.Conn
	t.Cleanup(func() {
		ln.Close()
		for _, c := range fill {
			c.Close()
		}
	})
	// Fill the queue until a dial hangs.
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return addr
			}
			t.Fatalf("filling the accept queue: %v", err)
		}
		fill = append(fill, c)
		if len(fill) > 16 || ctx.Err() != nil {
			t.Fatalf("the kernel accepted %d dials to a listener with a full accept queue: it does not drop SYNs there, so no dial can be left in progress", len(fill))
		}
	}
}

// dialsInProgress counts this host's TCP sockets in SYN_SENT to addr.
func dialsInProgress(t *testing.T, addr string) int {
	t.Helper()
	_, ps, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := fmt.Sprintf("0100007F:%04X", port)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && fs[2] == want && fs[3] == "02" { // 02: SYN_SENT
			n++
		}
	}
	return n
}

// Close cuts short the dials and streams in progress: a Join to a peer
// that accepts TCP and never answers (its stream hangs), or to one whose
// handshake never completes (the dial hangs), ends when Close runs, not at
// TCPTimeout; Close does not wait for it either.
func TestShutdownEndsDialsInProgress(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		peer func(ctx context.Context, t *testing.T) (addr string, hung func() bool)
	}{
		{"stream", func(ctx context.Context, t *testing.T) (string, func() bool) {
			hole := newBlackHole(t, "127.0.0.1:0", true)
			return hole.ln.Addr().String(), func() bool { k, _ := hole.accepted(); return k > 0 }
		}},
		{"handshake", func(ctx context.Context, t *testing.T) (string, func() bool) {
			addr := fullBacklog(ctx, t)
			return addr, func() bool { return dialsInProgress(t, addr) > 0 }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
			defer cancel()
			addr, hung := tt.peer(ctx, t)
			cfg := lifeConfig("dial-" + tt.name)
			slowTCP(&cfg)
			c := startAlone(ctx, t, cfg)
			joined := make(chan error, 1)
			go func() { joined <- c.Join(context.Background(), []string{addr}) }()
			testkit.WaitFor(ctx, t, "the join's dial to hang", hung)
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			if err := result(ctx, t, closed, "Close"); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := result(ctx, t, joined, "Join"); err == nil {
				t.Fatal("a Join cut short by Close returned nil")
			}
		})
	}
}

// newLone returns a coordinator of a cluster of its own, not started.
func newLone(t *testing.T, name string) *Coordinator {
	t.Helper()
	c, err := New(lifeConfig(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The lifecycle as a careless user drives it: every call out of order
// returns nil or a clear error at once, never panics or hangs.
func TestLifecycleMisuse(t *testing.T) {
	t.Parallel()
	t.Run("close before start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		c := newLone(t, "m-cbs")
		if err := c.Close(); err != nil {
			t.Fatalf("Close before Start: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close again: %v", err)
		}
		for what, err := range map[string]error{
			"Start":         c.Start(ctx),
			"Leave":         c.Leave(ctx),
			"Join":          c.Join(ctx, []string{"127.0.0.1:1"}),
			"Resign":        c.Resign(ctx, 0),
			"WaitConverged": c.WaitConverged(ctx),
		} {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close (never started) returned %v, want ErrClosed", what, err)
			}
		}
		if c.Leaving() {
			t.Error("Leaving after a refused Leave")
		}
	})
	// Issue 19, item 11: WaitConverged before Start returned only when its
	// context ended.
	t.Run("wait before start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := within(context.Background())
		defer cancel()
		c := newLone(t, "m-wbs")
		if err := c.WaitConverged(ctx); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("WaitConverged before Start returned %v, want ErrNotStarted", err)
		}
	})
	t.Run("wait during start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		hole := newBlackHole(t, "127.0.0.1:0", true)
		cfg, _, _ := holeSeeded(t, "m-wds", hole)
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		started := make(chan error, 1)
		go func() { started <- c.Start(ctx) }()
		testkit.WaitFor(ctx, t, "the join's stream", func() bool { n, _ := hole.accepted(); return n > 0 })
		// Start hangs in its join: WaitConverged waits for its context.
		wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer wcancel()
		if err := c.WaitConverged(wctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitConverged during Start returned %v, want its context's end", err)
		}
		closeWithin(t, c)
		if err := result(ctx, t, started, "Start"); !errors.Is(err, ErrClosed) {
			t.Fatalf("Start cut by Close returned %v, want ErrClosed", err)
		}
		if err := c.WaitConverged(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitConverged after Close returned %v, want ErrClosed", err)
		}
	})
	t.Run("start twice", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		c := newLone(t, "m-st")
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- c.Start(ctx) }()
		}
		a, b := result(ctx, t, errs, "Start"), result(ctx, t, errs, "Start")
		if a != nil {
			a, b = b, a
		}
		if a != nil || !errors.Is(b, ErrStarted) {
			t.Fatalf("two Starts returned %v and %v, want nil and ErrStarted", a, b)
		}
		if err := c.Start(ctx); !errors.Is(err, ErrStarted) {
			t.Fatalf("Start of a running coordinator returned %v, want ErrStarted", err)
		}
		c.Close()
		if err := c.Start(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Start after Close returned %v, want ErrClosed", err)
		}
	})
	t.Run("close twice at once", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		host, port := freeAddr(t)
		cfg := lifeConfig("m-ct")
		cfg.BindAddr, cfg.BindPort = host, port
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- c.Close() }()
		}
		for range 2 {
			if err := result(ctx, t, errs, "Close"); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}
		// Both returned: neither left before the other's work was done.
		if err := gossipStopped(host, port); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("leave after close", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		c := newLone(t, "m-lac")
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		c.Close()
		if err := c.Leave(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Leave after Close returned %v, want ErrClosed", err)
		}
		if c.Leaving() {
			t.Error("Leaving after a refused Leave")
		}
		if err := c.Join(ctx, []string{"127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Join after Close returned %v, want ErrClosed", err)
		}
		if err := c.WaitConverged(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitConverged after Close returned %v, want ErrClosed", err)
		}
		ch, _ := c.Subscribe(1)
		if _, ok := <-ch; ok {
			t.Fatal("a subscription made after Close is open")
		}
		// A stale report after Close concerns no live lease: nothing takes it.
		self := c.Self()
		tok := ownership.Token{Partition: 0, Epoch: 1, Owner: self.Name, Incarnation: self.Incarnation}
		cur := ownership.Token{Partition: 0, Epoch: 2, Owner: "other", Incarnation: 1}
		for range 100 { // the loop's input queue has room: it must not be used
			if c.ReportStale(ownership.Stale(tok, cur)) {
				t.Fatal("ReportStale after Close reported a lease of this node")
			}
		}
		_ = c.Status()
		_, _ = c.Lease([]byte("k"))
		_, _ = c.Owner([]byte("k"))
		_ = c.Members()
	})
	t.Run("leave before start", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		c := newLone(t, "m-lbs")
		if err := c.Leave(ctx); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("Leave before Start returned %v, want ErrNotStarted", err)
		}
		if err := c.Resign(ctx, 0); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("Resign before Start returned %v, want ErrNotStarted", err)
		}
		if err := c.Join(ctx, []string{"127.0.0.1:1"}); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("Join before Start returned %v, want ErrNotStarted", err)
		}
		// Nothing was spoiled: the coordinator starts and leaves.
		if err := c.Start(ctx); err != nil {
			t.Fatalf("Start after a refused Leave: %v", err)
		}
		if err := c.Leave(ctx); err != nil {
			t.Fatalf("Leave: %v", err)
		}
		if err := c.Leave(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Leave again returned %v, want ErrClosed", err)
		}
	})
	t.Run("leave with its context ended", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
		defer cancel()
		c := newLone(t, "m-lce")
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		dead, kill := context.WithCancel(ctx)
		kill()
		if err := c.Leave(dead); !errors.Is(err, context.Canceled) {
			t.Fatalf("Leave with an ended context returned %v, want context.Canceled", err)
		}
		// The coordinator is closed, as after Close.
		if err := c.WaitConverged(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitConverged after the Leave returned %v, want ErrClosed", err)
		}
	})
}

// Leave's context ending during the handoff (a Release that drains past
// it) makes Leave return ctx's error at once: the lease ends as in Close,
// and Close is done when Leave returns.
func TestLeaveReturnsWhenItsContextEndsDuringTheHandoff(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leaver, draining := drainingLeaver(ctx, t, "x")
	lctx, lcancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() { left <- leaver.c.Leave(lctx) }()
	select {
	case <-draining:
	case <-ctx.Done():
		t.Fatal("no Release during the Leave")
	}
	lcancel()
	bctx, bcancel := within(ctx)
	defer bcancel()
	if err := result(bctx, t, left, "Leave"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Leave whose context ended during the handoff returned %v, want context.Canceled", err)
	}
	if err := leaver.c.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after the Leave returned %v, want ErrClosed", err)
	}
}

// A join that keeps failing (the seed hangs up) is tried again, each
// failure logged at Info, until Start's context ends: Start then returns
// an error wrapping the context's error and the last join's error, and
// the coordinator is closed with its gossip stopped (Start's doc).
func TestStartWhoseJoinFails(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	hole := newBlackHole(t, "127.0.0.1:0", false)
	cfg, host, port := holeSeeded(t, "sfail", hole)
	logs := newLogCapture()
	cfg.Logger = slog.New(logs)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, c)
	startCtx, stop := context.WithTimeout(ctx, 20*cfg.RetryInterval)
	defer stop()
	started := make(chan error, 1)
	go func() { started <- c.Start(startCtx) }()
	err = result(ctx, t, started, "Start")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "failed to join "+hole.ln.Addr().String()) {
		t.Fatalf("Start whose seed hung up until its context ended returned %v, want the context's error wrapping the join's", err)
	}
	retries := logs.records(func(r logRecord) bool { return r.msg == "join failed; trying again" && r.level == slog.LevelInfo })
	if len(retries) < 2 {
		t.Fatalf("%d failed joins logged at Info, want every attempt (at least 2 in %v)", len(retries), 20*cfg.RetryInterval)
	}
	if err := gossipStopped(host, port); err != nil {
		t.Fatalf("after a failed Start: %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after a failed Start returned %v, want ErrClosed", err)
	}
}

// A seed that is not up yet when a node starts is normal at a cluster's
// start: Start keeps trying (its failures logged at Info) and succeeds
// once the seed listens; the two then form one cluster.
func TestStartWaitsForALateSeed(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	host, port := freeAddr(t) // the seed's address, reserved: nothing listens yet
	logs := newLogCapture()
	cfg := lifeConfig("early")
	cfg.Logger = slog.New(logs)
	cfg.Seeds = []string{net.JoinHostPort(host, strconv.Itoa(port))}
	early, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, early)
	started := make(chan error, 1)
	go func() { started <- early.Start(ctx) }()
	testkit.WaitFor(ctx, t, "a failed join logged at Info", func() bool {
		select {
		case err := <-started:
			t.Fatalf("Start returned %v before its seed was up, want it to keep trying", err)
		default:
		}
		return len(logs.records(func(r logRecord) bool { return r.msg == "join failed; trying again" && r.level == slog.LevelInfo })) > 0
	})
	seedCfg := lifeConfig("late")
	seedCfg.BindAddr, seedCfg.BindPort = host, port
	late := startAlone(ctx, t, seedCfg)
	if err := result(ctx, t, started, "Start"); err != nil {
		t.Fatalf("Start whose seed came up late returned %v, want nil", err)
	}
	testkit.WaitFor(ctx, t, "both nodes in both tables", func() bool {
		a, b := early.Table(), late.Table()
		return a != nil && b != nil && a.Len() == 2 && b.Len() == 2
	})
}

// closeWithin closes c, failing the test if Close does not return within
// bound (it waits for a Start in flight: a Start stuck forever holds it).
func closeWithin(t *testing.T, c *Coordinator) {
	t.Helper()
	ctx, cancel := within(context.Background())
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	_ = result(ctx, t, closed, "Close")
}

// handlingStreams counts the goroutines serving an accepted gossip stream
// (memberlist's handleConn), of every node in this process.
func handlingStreams() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "memberlist.(*Memberlist).handleConn(")
}

// A peer that opened a gossip stream to this node and went silent does not
// keep memberlist's handler of it running after Close (it would until
// TCPTimeout: memberlist's Shutdown closes the listener, not the streams
// it accepted). Not parallel: it counts every node's handlers, and
// parallel tests wait until the sequential ones are done.
func TestShutdownEndsAcceptedStreams(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	testkit.WaitFor(ctx, t, "earlier tests' stream handlers to end", func() bool { return handlingStreams() == 0 })
	cfg := lifeConfig("accepted")
	slowTCP(&cfg)
	c := startAlone(ctx, t, cfg)
	silent, err := net.Dial("tcp", c.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	testkit.WaitFor(ctx, t, "the node to serve the silent stream", func() bool { return handlingStreams() == 1 })
	c.Close()
	testkit.WaitFor(ctx, t, "the handler of the silent stream to end after Close", func() bool { return handlingStreams() == 0 })
}

// The shortest RetryInterval Validate takes, a nanosecond, made Start's
// first wait zero (half the backoff plus jitter of at most as much again)
// and the clock's ticker panicked in Start ("non-positive interval").
// Start must wait on, and return ctx's error, without a panic.
func TestStartRetriesWithANanosecondInterval(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), lifeDeadline)
	defer cancel()
	host, port := freeAddr(t) // nothing listens
	cfg := lifeConfig("nano")
	cfg.Seeds = []string{net.JoinHostPort(host, strconv.Itoa(port))}
	cfg.RetryInterval, cfg.MaxRetryInterval = time.Nanosecond, time.Nanosecond
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, c)
	startCtx, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stop()
	started := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				started <- fmt.Errorf("Start panicked: %v", p)
			}
		}()
		started <- c.Start(startCtx)
	}()
	if err := result(ctx, t, started, "Start"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start with a 1ns RetryInterval and no seed up returned %v, want the context's error", err)
	}
}
