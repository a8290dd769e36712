package pressure

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// CgroupRoot is where the cgroup hierarchies are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// period is the quota's accounting period: the kernel's default, 100 ms.
const period = 100 * time.Millisecond

// groupPrefix names the cgroups this package makes:
// tenure-pressure-<pid of the maker>-<sequence>.
const groupPrefix = "tenure-pressure-"

var seq atomic.Uint64

// Throttle is a cgroup with a CPU quota: the processes added to it get at
// most Percent of one core between them, whatever the machine has free.
// Its methods are safe for concurrent use.
type Throttle struct {
	// Percent is the quota, in percent of one core.
	Percent int

	v    int    // cgroup version: 1 or 2
	base string // the hierarchy's root: .../cpu (v1) or the unified root (v2)
	dir  string // this group

	mu     sync.Mutex
	home   map[int]string // pid -> the group it was in before Add
	closed bool
}

// Stat is what the kernel counted for a throttle's group.
type Stat struct {
	Periods   int64         // accounting periods with a runnable process
	Throttled int64         // periods in which the group hit its quota
	Waited    time.Duration // time its processes were held back, in all
}

// NewThrottle makes a cgroup under CgroupRoot that holds its processes to
// percent of one core (1 to 100 times the number of cores). It returns an
// error naming what is missing where the machine has no cpu controller or
// the caller may not make a group (a quota needs root). Close removes it.
func NewThrottle(percent int) (*Throttle, error) {
	return newThrottle(CgroupRoot, percent)
}

func newThrottle(root string, percent int) (*Throttle, error) {
	if percent < 1 || percent > 100*maxCores {
		return nil, fmt.Errorf("pressure: CPU quota of %d%% of a core, want 1 to %d", percent, 100*maxCores)
	}
	v, base, err := hierarchy(root)
	if err != nil {
		return nil, err
	}
	sweep(base)
	t := &Throttle{Percent: percent, v: v, base: base, home: map[int]string{}}
	t.dir = filepath.Join(base, fmt.Sprintf("%s%d-%d", groupPrefix, os.Getpid(), seq.Add(1)))
	if err := os.Mkdir(t.dir, 0o755); err != nil {
		return nil, fmt.Errorf("pressure: make cgroup %s: %w (a CPU quota needs root, or write access to the cgroup tree)", t.dir, err)
	}
	quota := int64(period/time.Microsecond) * int64(percent) / 100
	if v == 1 {
		err = errors.Join(
			write(filepath.Join(t.dir, "cpu.cfs_period_us"), strconv.FormatInt(int64(period/time.Microsecond), 10)),
			write(filepath.Join(t.dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)))
	} else {
		err = write(filepath.Join(t.dir, "cpu.max"), fmt.Sprintf("%d %d", quota, period/time.Microsecond))
	}
	if err != nil {
		_ = os.Remove(t.dir)
		return nil, fmt.Errorf("pressure: set the CPU quota of %s: %w", t.dir, err)
	}
	return t, nil
}

// maxCores bounds a quota: no machine this runs on has more.
const maxCores = 1024

// hierarchy finds the cpu controller under root: cgroup v1's cpu
// hierarchy, else cgroup v2's unified one with the cpu controller enabled
// for the root's children.
func hierarchy(root string) (version int, base string, err error) {
	v1 := filepath.Join(root, "cpu")
	if _, err := os.Stat(filepath.Join(v1, "cpu.cfs_quota_us")); err == nil {
		return 1, v1, nil
	}
	ctl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil || !contains(strings.Fields(string(ctl)), "cpu") {
		return 0, "", fmt.Errorf("pressure: no cgroup cpu controller under %s (neither cgroup v1's cpu/cpu.cfs_quota_us nor cgroup v2's cgroup.controllers listing cpu): a CPU quota can't be made on this machine", root)
	}
	sub := filepath.Join(root, "cgroup.subtree_control")
	if on, err := os.ReadFile(sub); err != nil || !contains(strings.Fields(string(on)), "cpu") {
		if err := write(sub, "+cpu"); err != nil {
			return 0, "", fmt.Errorf("pressure: enable the cpu controller in %s: %w (a CPU quota needs root)", sub, err)
		}
	}
	return 2, root, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Add moves process pid (all its threads) into the group. The children it
// starts from then on are in the group too. Close moves it back.
func (t *Throttle) Add(pid int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("pressure: throttle closed")
	}
	home, err := t.groupOf(pid)
	if err != nil {
		return err
	}
	if err := write(filepath.Join(t.dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("pressure: throttle process %d: %w", pid, err)
	}
	if _, ok := t.home[pid]; !ok {
		t.home[pid] = home
	}
	return nil
}

// groupOf returns the directory of the group pid is in, in t's hierarchy.
func (t *Throttle) groupOf(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", fmt.Errorf("pressure: process %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		if t.v == 2 && f[0] == "0" || t.v == 1 && contains(strings.Split(f[1], ","), "cpu") {
			return filepath.Join(t.base, f[2]), nil
		}
	}
	return "", fmt.Errorf("pressure: process %d: no cpu cgroup in /proc/%d/cgroup", pid, pid)
}

// Stat returns the kernel's counts for the group.
func (t *Throttle) Stat() (Stat, error) {
	b, err := os.ReadFile(filepath.Join(t.dir, "cpu.stat"))
	if err != nil {
		return Stat{}, fmt.Errorf("pressure: %w", err)
	}
	var s Stat
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "nr_periods":
			s.Periods = n
		case "nr_throttled":
			s.Throttled = n
		case "throttled_time": // v1, in ns
			s.Waited = time.Duration(n)
		case "throttled_usec": // v2
			s.Waited = time.Duration(n) * time.Microsecond
		}
	}
	return s, nil
}

// Close moves every process of the group back where it was before Add
// (a child started meanwhile goes where its first added ancestor was) and
// removes the group. It may be called more than once.
func (t *Throttle) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	fallback := t.base
	for _, h := range t.home {
		fallback = h
		break
	}
	return empty(t.dir, func(pid int) string {
		if h, ok := t.home[pid]; ok {
			return h
		}
		return fallback
	})
}

// empty moves the processes of group dir to the groups home names and
// removes it, retrying for a moment: a process that is exiting, or was
// forked as it was read, keeps a group busy briefly.
func empty(dir string, home func(pid int) string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var errs []error
		for _, pid := range procs(dir) {
			if err := write(filepath.Join(home(pid), "cgroup.procs"), strconv.Itoa(pid)); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("move process %d out: %w", pid, err))
			}
		}
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pressure: remove cgroup %s: %w", dir, errors.Join(append(errs, err)...))
		}
		time.Sleep(10 * time.Millisecond) // the kernel gives no event to wait for
	}
}

// procs lists the processes in group dir.
func procs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// sweep removes the groups this package made in processes that have died
// without closing them (a test binary killed by its timeout).
func sweep(base string) {
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), groupPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		owner, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(owner)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its maker still runs
		}
		_ = empty(filepath.Join(base, e.Name()), func(int) string { return base })
	}
}

func write(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Throttled holds process pid to percent of one core for d (or until ctx
// ends), then releases it and removes the group, and returns what the
// kernel counted. The group is removed whatever happens.
func Throttled(ctx context.Context, pid, percent int, d time.Duration) (Stat, error) {
	if d <= 0 || d > MaxDuration {
		return Stat{}, fmt.Errorf("pressure: throttle for %v, want more than 0 and at most %v", d, MaxDuration)
	}
	t, err := NewThrottle(percent)
	if err != nil {
		return Stat{}, err
	}
	if err := t.Add(pid); err != nil {
		return Stat{}, errors.Join(err, t.Close())
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
	st, err := t.Stat()
	return st, errors.Join(err, t.Close())
}
