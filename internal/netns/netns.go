//go:build linux

package netns

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// host is the name Partition, Cut and Loss don't accept: the root
// namespace's end of the network, where the test itself runs.
const host = "host"

// A Net is a test network: one namespace per node, each with a veth into a
// bridge in a hub namespace, and a veth from the root namespace (the host,
// where the test runs) into the same bridge. No namespace has a route
// beyond the subnet and nothing forwards or translates, so traffic stays
// inside.
type Net struct {
	id     string // Prefix + pid + subnet, the namespaces' common prefix
	hub    string
	hostIf string
	subnet netip.Prefix
	nodes  []string
	addrs  map[string]netip.Addr

	mu     sync.Mutex
	cuts   map[[2]string]bool // from, to
	loss   map[string]int
	apart  map[string]bool // isolated at the bridge
	closed bool
}

// nodeName is what New accepts as a node name: it becomes part of a
// namespace's name.
var nodeName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,19}$`)

// New builds a network of the named nodes (at most 250) on a free private
// /24 (10.x.y.0/24, x >= 128, not routed in the root namespace): the host
// (the root namespace) has .1, the nodes .2 on in order. It first removes
// the namespaces a crashed earlier run left. It needs root and iproute2's
// ip and nftables' nft, and says so when one is missing. Close removes
// everything it made; on an error New removes what it made so far.
func New(nodes ...string) (*Net, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if len(nodes) == 0 || len(nodes) > 250 {
		return nil, fmt.Errorf("netns: %d nodes; want 1 to 250", len(nodes))
	}
	for i, n := range nodes {
		if !nodeName.MatchString(n) || n == host || slices.Contains(nodes[:i], n) {
			return nil, fmt.Errorf("netns: node name %q: want a unique [a-z0-9-] name of up to 20 characters, not %q", n, host)
		}
	}
	if err := Sweep(); err != nil {
		return nil, err
	}
	subnet, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	b := subnet.Addr().As4()
	n := &Net{
		id:     fmt.Sprintf("%s%d-%d-%d", Prefix, os.Getpid(), b[1], b[2]),
		hostIf: fmt.Sprintf("tnr%02x%02x", b[1], b[2]),
		subnet: subnet,
		nodes:  slices.Clone(nodes),
		addrs:  map[string]netip.Addr{},
		cuts:   map[[2]string]bool{},
		loss:   map[string]int{},
		apart:  map[string]bool{},
	}
	n.hub = n.id + "-hub"
	if err := n.build(); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// Available says why this process can't build a Net, or nil if it can.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netns: network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN): run the test as root, as CI does; without root, use the in-process cut")
	}
	for _, tool := range []struct{ cmd, pkg string }{{"ip", "iproute2"}, {"nft", "nftables"}} {
		if _, err := exec.LookPath(tool.cmd); err != nil {
			return fmt.Errorf("netns: %s not found: install Debian's %s (.ci/test does): %w", tool.cmd, tool.pkg, err)
		}
	}
	return nil
}

func (n *Net) build() error {
	v4 := n.subnet.Addr().As4()
	addr := func(i int) netip.Addr { a := v4; a[3] = byte(i); return netip.AddrFrom4(a) }
	cmds := [][]string{
		{"netns", "add", n.hub},
		{"-n", n.hub, "link", "set", "lo", "up"},
		{"-n", n.hub, "link", "add", "br0", "type", "bridge"},
		{"-n", n.hub, "link", "set", "br0", "up"},
		// The host's end: the only link into the root namespace. It dies
		// with the hub, which holds its peer.
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", host, "netns", n.hub},
		{"-n", n.hub, "link", "set", host, "master", "br0", "up"},
		{"addr", "add", addr(1).String() + "/24", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
	}
	for i, node := range n.nodes {
		ns, a, port := n.ns(node), addr(i+2), n.port(i)
		n.addrs[node] = a
		cmds = append(cmds,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", n.hub},
			[]string{"-n", n.hub, "link", "set", port, "master", "br0", "up"},
			[]string{"-n", ns, "addr", "add", a.String() + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
		)
	}
	for _, c := range cmds {
		if err := ip(c...); err != nil {
			return err
		}
	}
	return nil
}

// port is the name of the i-th node's port on the hub's bridge.
func (n *Net) port(i int) string { return "n" + strconv.Itoa(i) }

// ns is node's namespace name.
func (n *Net) ns(node string) string { return n.id + "-" + node }

// Namespace returns the name of node's namespace (as ip netns knows it).
func (n *Net) Namespace(node string) string { return n.ns(n.must(node)) }

// Addr returns node's address.
func (n *Net) Addr(node string) netip.Addr { return n.addrs[n.must(node)] }

// HostAddr returns the root namespace's address on the network: the test
// reaches the nodes from there, and no fault touches it.
func (n *Net) HostAddr() netip.Addr { return n.subnet.Addr().Next() }

// Nodes returns the nodes' names, in New's order.
func (n *Net) Nodes() []string { return slices.Clone(n.nodes) }

func (n *Net) must(node string) string {
	if _, ok := n.addrs[node]; !ok {
		panic(fmt.Sprintf("netns: no node %q", node))
	}
	return node
}

// Command returns a command that runs name inside node's namespace (ip
// netns exec, which execs name: the process's pid is the command's).
func (n *Net) Command(node, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Namespace(node), name}, args...)...)
}

// Do runs f on an OS thread switched into node's namespace, then switches
// the thread back. A socket f opens stays in node's namespace for its
// life, wherever it is used afterwards; goroutines f starts do not run in
// the namespace.
func (n *Net) Do(node string, f func() error) error {
	return do("/run/netns/"+n.Namespace(node), f)
}

func do(path string, f func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: %w", err)
	}
	defer orig.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: setns %s: %w", path, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime ends it with this
		// goroutine rather than run anything else in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("netns: setns back: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Partition cuts every node of each group from every node of the other
// groups, both ways, on top of the faults in place. Nodes in no group, and
// the host, keep every link.
func (n *Net) Partition(groups ...[]string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.cuts[[2]string{n.must(a), n.must(b)}] = true
					n.cuts[[2]string{b, a}] = true
				}
			}
		}
	}
	return n.apply()
}

// Cut drops every packet from node from to node to, one way: to's packets
// still reach from (so TCP in either direction fails, UDP from to to from
// passes).
func (n *Net) Cut(from, to string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cuts[[2]string{n.must(from), n.must(to)}] = true
	return n.apply()
}

// Loss drops percent (0 to 100) of the packets that reach node from the
// network, at random (nftables' numgen random), from any sender.
func (n *Net) Loss(node string, percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("netns: loss of %d%%", percent)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loss[n.must(node)] = percent
	return n.apply()
}

// Isolate cuts node from everything, the host included, at the hub's
// bridge: every frame to or from its port is dropped there, as if its
// cable were pulled, and neither side's sends fail.
func (n *Net) Isolate(node string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.apart[n.must(node)] = true
	return n.apply()
}

// Heal removes every fault.
func (n *Net) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cuts)
	clear(n.loss)
	clear(n.apart)
	return n.apply()
}

// apply writes each node's nftables table (inet tenure) from the faults,
// replacing the old one in one transaction: an input chain that drops
// what is cut from the node and its share of loss; and the hub's (bridge
// tenure), whose forward chain drops the isolated nodes' frames.
func (n *Net) apply() error {
	if n.closed {
		return errors.New("netns: closed")
	}
	var ports string
	for i, node := range n.nodes {
		if n.apart[node] {
			ports += fmt.Sprintf("\t\tiifname %q drop\n\t\toifname %q drop\n", n.port(i), n.port(i))
		}
	}
	if err := nft(n.hub, "table bridge tenure\ndelete table bridge tenure\ntable bridge tenure {\n"+
		"\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n"+ports+"\t}\n}\n"); err != nil {
		return err
	}
	for _, node := range n.nodes {
		// Dropped where they arrive, as a real cut does: a sender's own
		// output chain would fail its send at once (EPERM) instead.
		var from []string
		for _, peer := range n.nodes {
			if n.cuts[[2]string{peer, node}] {
				from = append(from, n.addrs[peer].String())
			}
		}
		var in string
		if len(from) > 0 {
			in = fmt.Sprintf("\t\tip saddr { %s } drop\n", strings.Join(from, ", "))
		}
		if p := n.loss[node]; p > 0 {
			in += fmt.Sprintf("\t\tiifname \"eth0\" numgen random mod 100 < %d drop\n", p)
		}
		rules := "table inet tenure\ndelete table inet tenure\ntable inet tenure {\n" +
			"\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n" + in + "\t}\n}\n"
		if err := nft(n.ns(node), rules); err != nil {
			return err
		}
	}
	return nil
}

// nft loads rules into namespace ns.
func nft(ns, rules string) error {
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netns: nft in %s: %w: %s", ns, err, bytes.TrimSpace(b))
	}
	return nil
}

// Close kills every process left in the network's namespaces and removes
// them (the links go with them). It is idempotent.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	// Deleting a namespace deletes its links in the background; the one in
	// the root namespace goes now (with its peer), or a route to the
	// subnet outlives Close.
	if err := exec.Command("ip", "link", "show", n.hostIf).Run(); err == nil {
		errs = append(errs, ip("link", "del", n.hostIf))
	}
	for _, node := range n.nodes {
		errs = append(errs, remove(n.ns(node)))
	}
	return errors.Join(append(errs, remove(n.hub))...)
}

// remove kills the processes in namespace ns and deletes it; a namespace
// that does not exist is removed already.
func remove(ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// A process left inside would keep the namespace alive, unnamed.
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return fmt.Errorf("netns: pids of %s: %w", ns, err)
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return ip("netns", "del", ns)
}

// Sweep removes the namespaces (and with them the links) that a Net of a
// process that no longer runs left behind: a crashed or killed test's.
func Sweep() error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("netns: ip netns list: %w", err)
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], Prefix) {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f[0], Prefix), "-", 2)[0])
		if err != nil || alive(pid) {
			continue
		}
		errs = append(errs, remove(f[0]))
	}
	return errors.Join(errs...)
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// freeSubnet returns a /24 in 10.128.0.0/9 that no route of the root
// namespace overlaps, starting from one derived from the pid so that
// concurrent test processes start apart.
func freeSubnet() (netip.Prefix, error) {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("netns: ip route: %w", err)
	}
	var used []netip.Prefix
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "local" || f[0] == "broadcast") && len(f) > 1 {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		if f[0] == "default" {
			continue // the way out: a subnet of ours is more specific
		}
		if p, err := netip.ParsePrefix(f[0]); err == nil {
			used = append(used, p)
		} else if a, err := netip.ParseAddr(f[0]); err == nil {
			used = append(used, netip.PrefixFrom(a, 32))
		}
	}
	start := os.Getpid() * 7919
	for i := range 1 << 15 {
		k := (start + i) % (1 << 15)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + k>>8), byte(k), 0}), 24)
		if !slices.ContainsFunc(used, p.Overlaps) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("netns: no free /24 in 10.128.0.0/9")
}

// ip runs iproute2's ip with args.
func ip(args ...string) error {
	if b, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("netns: ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(b))
	}
	return nil
}
