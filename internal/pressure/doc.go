// Package pressure makes CPU pressure a fault a test can inject, bounded in
// size and time and undone when the test ends:
//
//   - a throttled process (Throttle): a process in a cgroup with a CPU
//     quota, as a Kubernetes CPU limit does to a container (cgroup v1's
//     cpu.cfs_quota_us, or cgroup v2's cpu.max where that is what the
//     machine has). Making one needs the cpu controller and root; where it
//     can't be made, NewThrottle returns an error saying why, and a test
//     must fail with it, never skip;
//   - a busy machine (Busy): a bounded number of busy loops per core, each
//     a child process that ends by itself after a bounded time even if the
//     caller dies;
//   - micro-pauses (Pauses): SIGSTOP and SIGCONT of a process at random
//     (from a seeded source), 50-500 ms each by default, like a collector's
//     stop-the-world pauses, for a bounded time. The process is always
//     continued when Pauses returns.
//
// The caller's duties, in order: make the fault (NewThrottle then Add, or
// Busy, or Pauses), run the workload, and end the fault (Throttle.Close,
// Load.Stop; Pauses ends on its own) in a defer or t.Cleanup, so a failing
// test leaves nothing behind. A cgroup left by a process that died before
// its Close is removed by the next NewThrottle.
//
// Everything here acts on real processes of this machine; it is test
// machinery, internal to tenure's tests, the chaos suite and the demo.
package pressure
