//go:build linux

package netns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const noRootEnv = "TENURE_NETNS_NOROOT"

// newNet builds a Net of nodes that the test's end removes.
func newNet(t *testing.T, nodes ...string) *Net {
	t.Helper()
	n, err := New(nodes...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// echo is a TCP echo server listening on node's address, in its namespace
// (or on the host's, node ""), until the test ends.
func echo(t *testing.T, n *Net, node string) string {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) {
		addr := n.HostAddr()
		if node != "" {
			addr = n.Addr(node)
		}
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	}
	if err := inNode(n, node, listen); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// inNode runs f in node's namespace, or in the host's for node "".
func inNode(n *Net, node string, f func() error) error {
	if node == "" {
		return f()
	}
	return n.Do(node, f)
}

// exchange dials addr from node's namespace (the host's, node "") and has
// a byte echoed back within timeout.
func exchange(n *Net, node, addr string, timeout time.Duration) error {
	var c net.Conn
	dial := func() (err error) {
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	}
	if err := inNode(n, node, dial); err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{42}); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if b[0] != 42 {
		return errors.New("echo garbled")
	}
	return nil
}

// Generous where an exchange must work (a loaded machine is slow), short
// where it must not (a dropped SYN only ever times out).
const (
	works = 10 * time.Second
	cut   = 500 * time.Millisecond
)

func TestPartitionCutsTCPBothWaysUntilHeal(t *testing.T) {
	n := newNet(t, "a", "b", "c")
	ea, eb, ec := echo(t, n, "a"), echo(t, n, "b"), echo(t, n, "c")
	type path struct{ from, to, addr string }
	all := []path{{"a", "b", eb}, {"b", "a", ea}, {"a", "c", ec}, {"c", "a", ea}, {"b", "c", ec}, {"c", "b", eb}, {"", "a", ea}, {"", "b", eb}}
	check := func(stage string, isCut func(p path) bool) {
		t.Helper()
		for _, p := range all {
			timeout := works
			if isCut(p) {
				timeout = cut
			}
			err := exchange(n, p.from, p.addr, timeout)
			if isCut(p) != (err != nil) {
				t.Errorf("%s: %q -> %q: cut %v, exchange error %v", stage, p.from, p.to, isCut(p), err)
			}
		}
	}
	check("before", func(path) bool { return false })
	if err := n.Partition([]string{"a"}, []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	// a is alone; b and c, and the host to everyone, still talk.
	check("partitioned", func(p path) bool { return p.from != "" && (p.from == "a") != (p.to == "a") })
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	check("healed", func(path) bool { return false })
}

func TestIsolateCutsTheHostToo(t *testing.T) {
	n := newNet(t, "a", "b", "c")
	ea, eb, host := echo(t, n, "a"), echo(t, n, "b"), echo(t, n, "")
	for _, c := range []struct{ from, addr string }{{"", ea}, {"b", ea}, {"a", host}, {"a", eb}, {"c", eb}} {
		if err := exchange(n, c.from, c.addr, works); err != nil {
			t.Fatalf("before: %q -> %s: %v", c.from, c.addr, err)
		}
	}
	if err := n.Isolate("a"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, addr string }{{"", ea}, {"b", ea}, {"a", host}, {"a", eb}} {
		if err := exchange(n, c.from, c.addr, cut); err == nil {
			t.Errorf("isolated: %q -> %s went through", c.from, c.addr)
		}
	}
	// The others, and the host, still reach each other.
	for _, c := range []struct{ from, addr string }{{"c", eb}, {"", eb}, {"b", host}} {
		if err := exchange(n, c.from, c.addr, works); err != nil {
			t.Errorf("isolated a: %q -> %s: %v", c.from, c.addr, err)
		}
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := exchange(n, "", ea, works); err != nil {
		t.Errorf("after Heal: host -> a: %v", err)
	}
}

// udp is a UDP socket bound in node's namespace.
func udp(t *testing.T, n *Net, node string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := n.Do(node, func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(n.Addr(node), 0)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// arrives sends a datagram from a to b and reports whether b got it
// within timeout.
func arrives(t *testing.T, a, b *net.UDPConn, timeout time.Duration) bool {
	t.Helper()
	msg := []byte(strconv.FormatInt(time.Now().UnixNano(), 10))
	if _, err := a.WriteToUDPAddrPort(msg, b.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = b.SetReadDeadline(time.Now().Add(timeout))
	for {
		k, _, err := b.ReadFromUDPAddrPort(buf)
		if err != nil {
			return false
		}
		if bytes.Equal(buf[:k], msg) {
			return true
		}
	}
}

func TestCutIsOneWay(t *testing.T) {
	n := newNet(t, "a", "b")
	a, b := udp(t, n, "a"), udp(t, n, "b")
	if !arrives(t, a, b, works) || !arrives(t, b, a, works) {
		t.Fatal("a and b can't exchange datagrams before the cut")
	}
	if err := n.Cut("a", "b"); err != nil {
		t.Fatal(err)
	}
	if arrives(t, a, b, cut) {
		t.Error("a datagram from a reached b across the cut a -> b")
	}
	if !arrives(t, b, a, works) {
		t.Error("the cut a -> b also dropped b -> a")
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if !arrives(t, a, b, works) {
		t.Error("a -> b still cut after Heal")
	}
}

// received sends count numbered datagrams from a to b, each after b's
// echo of the last one or wait, and returns how many distinct ones b got.
func received(t *testing.T, a, b *net.UDPConn, count int, wait time.Duration) int {
	t.Helper()
	got := map[uint32]bool{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 8)
		for {
			k, from, err := b.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if k == 4 {
				mu.Lock()
				got[binary.BigEndian.Uint32(buf)] = true
				mu.Unlock()
				_, _ = b.WriteToUDPAddrPort(buf[:4], from)
			}
		}
	}()
	dst := b.LocalAddr().(*net.UDPAddr).AddrPort()
	buf := make([]byte, 8)
	for i := range uint32(count) {
		if _, err := a.WriteToUDPAddrPort(binary.BigEndian.AppendUint32(nil, i), dst); err != nil {
			t.Fatal(err)
		}
		_ = a.SetReadDeadline(time.Now().Add(wait))
		for {
			k, _, err := a.ReadFromUDPAddrPort(buf)
			if err != nil || (k == 4 && binary.BigEndian.Uint32(buf) == i) {
				break
			}
		}
	}
	_ = b.SetReadDeadline(time.Now()) // ends the reader
	<-done
	_ = b.SetReadDeadline(time.Time{})
	mu.Lock()
	defer mu.Unlock()
	return len(got)
}

func TestLossDropsAboutItsPercentage(t *testing.T) {
	n := newNet(t, "a", "b")
	a, b := udp(t, n, "a"), udp(t, n, "b")
	if got := received(t, a, b, 100, works); got != 100 {
		t.Fatalf("without loss b received %d of 100 datagrams", got)
	}
	if err := n.Loss("b", 20); err != nil {
		t.Fatal(err)
	}
	// 400 draws at 20%: 80 lost on average, standard deviation 8.
	const count = 400
	got := received(t, a, b, count, 50*time.Millisecond)
	t.Logf("20%% loss: b received %d of %d", got, count)
	if lost := count - got; lost < 40 || lost > 120 {
		t.Errorf("20%% loss dropped %d of %d datagrams; want 40 to 120", lost, count)
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if got := received(t, a, b, 100, works); got != 100 {
		t.Errorf("after Heal b received %d of 100 datagrams", got)
	}
}

func TestTrafficStaysInside(t *testing.T) {
	n := newNet(t, "a")
	out, err := exec.Command("ip", "-n", n.Namespace("a"), "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		t.Fatal(err, string(out))
	}
	if strings.Contains(string(out), "default") {
		t.Errorf("node a has a default route:\n%s", out)
	}
	// Any address outside the subnet: the host's own, a public one.
	for _, dst := range []string{"192.0.2.1:9", "8.8.8.8:53", "127.0.0.2:9"} {
		err := n.Do("a", func() error {
			c, err := net.DialTimeout("tcp", dst, cut)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("node a reached %s outside its network", dst)
		}
	}
	// The negative control: the same dial to the host's address works.
	if err := exchange(n, "a", echo(t, n, ""), works); err != nil {
		t.Errorf("node a can't reach the host: %v", err)
	}
}

// namespaces lists the names ip netns knows that begin with prefix.
func namespaces(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names
}

func TestCloseRemovesEverything(t *testing.T) {
	n, err := New("a", "b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if got := namespaces(t, n.id); len(got) != 3 {
		t.Fatalf("namespaces %v; want a, b and the hub", got)
	}
	if err := ip("link", "show", n.hostIf); err != nil {
		t.Fatalf("no host link: %v", err)
	}
	// A process left running in a namespace.
	sleep := n.Command("a", "sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleep.Wait() }()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if got := namespaces(t, n.id); len(got) != 0 {
		t.Errorf("namespaces left after Close: %v", got)
	}
	if err := ip("link", "show", n.hostIf); err == nil {
		t.Errorf("host link %s left after Close", n.hostIf)
	}
	select {
	case err := <-exited:
		if err == nil {
			t.Error("the process in node a's namespace ended cleanly; want killed")
		}
	case <-time.After(works):
		_ = sleep.Process.Kill()
		<-exited
		t.Error("the process in node a's namespace outlived Close")
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSweepRemovesOnlyDeadProcessesNamespaces(t *testing.T) {
	// A pid that no longer runs: a child that has exited.
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := Prefix + strconv.Itoa(done.Process.Pid) + "-0-0-x"
	live := Prefix + strconv.Itoa(os.Getpid()) + "-0-0-sweeptest"
	for _, ns := range []string{dead, live} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = remove(ns) })
	}
	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	if got := namespaces(t, dead); len(got) != 0 {
		t.Errorf("Sweep left %v, made by a process that ended", got)
	}
	if got := namespaces(t, live); len(got) != 1 {
		t.Errorf("Sweep removed %s, made by this running process", live)
	}
}

func TestRelayIsCutWithItsNode(t *testing.T) {
	n := newNet(t, "a", "b", "db")
	// The service on the host's loopback, outside the network.
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	r, err := n.Relay("db", ln.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	for _, node := range []string{"a", "b"} {
		if err := exchange(n, node, r.Addr(), works); err != nil {
			t.Fatalf("%s through the relay: %v", node, err)
		}
	}
	if err := n.Partition([]string{"a"}, []string{"b", "db"}); err != nil {
		t.Fatal(err)
	}
	if err := exchange(n, "a", r.Addr(), cut); err == nil {
		t.Error("a reached the relay across the partition")
	}
	if err := exchange(n, "b", r.Addr(), works); err != nil {
		t.Errorf("b, on the relay's side, can't reach it: %v", err)
	}
	// From the host's loopback nothing of the network is reachable but
	// through the relay: the service itself is not on the network.
	if err := exchange(n, "b", netip.AddrPortFrom(n.HostAddr(), netip.MustParseAddrPort(ln.Addr().String()).Port()).String(), cut); err == nil {
		t.Error("b reached the loopback service without the relay")
	}
}

// Without root New fails with a message that says so: the test starts
// this binary as nobody (uid 65534).
func TestNoRootFailsClearly(t *testing.T) {
	dir, err := os.MkdirTemp("", "netns-noroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "netns.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), noRootEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "network namespaces need root") {
		t.Errorf("without root New said %q; want it to say it needs root", out)
	}
}
