//go:build linux

package pressure

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A spinning child in a group at 3% of a core uses no more CPU than the
// quota allows over its run (plus one period's slack), and the kernel
// reports that it held it back. 3% is below what a spinner gets on this
// machine under any load seen here, so the quota, not the load, is what
// bounds it.
func TestThrottleHoldsAChildToItsQuota(t *testing.T) {
	const percent, run = 3, 2 * time.Second
	th, err := NewThrottle(percent)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	child := spinner(run, "")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := th.Add(child.Process.Pid); err != nil {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	st, err := th.Stat()
	if err != nil {
		t.Fatal(err)
	}
	used := child.ProcessState.UserTime() + child.ProcessState.SystemTime()
	allowed := wall*percent/100 + period + 50*time.Millisecond
	t.Logf("child used %v of CPU in %v at %d%%; kernel: %+v", used, wall, percent, st)
	if used > allowed {
		t.Errorf("the throttled child used %v of CPU in %v; a quota of %d%% of a core allows %v", used, wall, percent, allowed)
	}
	if st.Throttled == 0 || st.Waited == 0 {
		t.Errorf("kernel counts %+v: want periods in which the group was throttled", st)
	}
	if err := th.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(th.dir); !os.IsNotExist(err) {
		t.Errorf("group %s still there after Close: %v", th.dir, err)
	}
}

// Close moves a live process back to the group it came from and removes
// the group; so does Throttled when its time is up.
func TestThrottleCloseMovesProcessesBack(t *testing.T) {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	}()
	pid := child.Process.Pid
	before := cgroupLine(t, pid)

	th, err := NewThrottle(50)
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Add(pid); err != nil {
		t.Fatal(err)
	}
	if in := cgroupLine(t, pid); !strings.Contains(in, filepath.Base(th.dir)) {
		t.Fatalf("after Add, /proc/%d/cgroup says %q; want the group %s", pid, in, th.dir)
	}
	if err := th.Close(); err != nil {
		t.Fatal(err)
	}
	if after := cgroupLine(t, pid); after != before {
		t.Errorf("after Close the child is in %q; it was in %q", after, before)
	}
	if _, err := os.Stat(th.dir); !os.IsNotExist(err) {
		t.Errorf("group %s still there after Close: %v", th.dir, err)
	}
	if err := th.Add(pid); err == nil {
		t.Errorf("Add after Close succeeded")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Throttled(ctx, pid, 50, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if after := cgroupLine(t, pid); after != before {
		t.Errorf("after Throttled the child is in %q; it was in %q", after, before)
	}
	if left := groups(t); len(left) > 0 {
		t.Errorf("groups left behind: %v", left)
	}
}

// A group whose maker died without closing it is removed by the next
// NewThrottle.
func TestNewThrottleSweepsGroupsOfDeadMakers(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	_, base, err := hierarchy(CgroupRoot)
	if err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(base, fmt.Sprintf("%s%d-1", groupPrefix, dead.Process.Pid))
	if err := os.Mkdir(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(orphan)
	th, err := NewThrottle(10)
	if err != nil {
		t.Fatal(err)
	}
	defer th.Close()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the dead maker's group %s is still there: %v", orphan, err)
	}
}

// Where a quota can't be made, the error says why; bad quotas are
// refused.
func TestThrottleErrors(t *testing.T) {
	if _, err := newThrottle(t.TempDir(), 10); err == nil || !strings.Contains(err.Error(), "no cgroup cpu controller") {
		t.Errorf("a root without cgroups: %v; want an error naming the missing cpu controller", err)
	}
	for _, pct := range []int{0, -5, 100*maxCores + 1} {
		if _, err := NewThrottle(pct); err == nil {
			t.Errorf("NewThrottle(%d) succeeded", pct)
		}
	}
	ctx := context.Background()
	for _, d := range []time.Duration{0, MaxDuration + 1} {
		if _, err := Throttled(ctx, os.Getpid(), 10, d); err == nil {
			t.Errorf("Throttled for %v succeeded", d)
		}
	}
	if left := groups(t); len(left) > 0 {
		t.Errorf("groups left behind: %v", left)
	}
}

// cgroupLine returns pid's line of the cpu hierarchy in /proc/pid/cgroup.
func cgroupLine(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && (f[0] == "0" || strings.Contains(","+f[1]+",", ",cpu,")) {
			return l
		}
	}
	t.Fatalf("no cpu line in /proc/%d/cgroup: %s", pid, b)
	return ""
}

// groups lists the groups this test process made that still exist.
func groups(t *testing.T) []string {
	t.Helper()
	_, base, err := hierarchy(CgroupRoot)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join(base, fmt.Sprintf("%s%d-*", groupPrefix, os.Getpid())))
	return m
}
