//go:build unix

package pressure

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"time"
)

// MaxDuration bounds every fault of this package.
const MaxDuration = 5 * time.Minute

// MaxLoopsPerCore bounds Busy.
const MaxLoopsPerCore = 4

// Load is a set of busy loops started by Busy.
type Load struct {
	cmds []*exec.Cmd
	done chan struct{} // closed when every loop has ended
	stop sync.Once
}

// Busy starts perCore busy loops per core of the machine
// (runtime.NumCPU), each a child process spinning on a core, and returns
// at once. Each loop ends by itself after d, even if this process dies
// before it can stop it; Stop ends them sooner. A loop competes for the
// cores with every process of the machine, as another workload would: it
// is not in the caller's cgroup's quota unless the caller is. perCore is 1
// to MaxLoopsPerCore, d at most MaxDuration. Needs bash.
func Busy(perCore int, d time.Duration) (*Load, error) {
	if perCore < 1 || perCore > MaxLoopsPerCore {
		return nil, fmt.Errorf("pressure: %d busy loops per core, want 1 to %d", perCore, MaxLoopsPerCore)
	}
	if d <= 0 || d > MaxDuration {
		return nil, fmt.Errorf("pressure: busy loops for %v, want more than 0 and at most %v", d, MaxDuration)
	}
	l := &Load{done: make(chan struct{})}
	for range perCore * runtime.NumCPU() {
		cmd := spinner(d, "")
		if err := cmd.Start(); err != nil {
			for _, c := range l.cmds {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
			return nil, fmt.Errorf("pressure: start a busy loop: %w", err)
		}
		l.cmds = append(l.cmds, cmd)
	}
	go func() {
		defer close(l.done)
		for _, c := range l.cmds {
			_ = c.Wait()
		}
	}()
	return l, nil
}

// Loops returns how many loops run (or ran).
func (l *Load) Loops() int { return len(l.cmds) }

// CPU returns the CPU time the loops used, in all, once they have ended;
// zero while any runs.
func (l *Load) CPU() time.Duration {
	select {
	case <-l.done:
	default:
		return 0
	}
	var sum time.Duration
	for _, c := range l.cmds {
		if c.ProcessState != nil {
			sum += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
		}
	}
	return sum
}

// Wait waits until every loop has ended (by itself, or by Stop), or ctx
// ends.
func (l *Load) Wait(ctx context.Context) error {
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop kills the loops and waits for them. It may be called more than
// once.
func (l *Load) Stop() {
	l.stop.Do(func() {
		for _, c := range l.cmds {
			_ = c.Process.Kill()
		}
	})
	<-l.done
}

// spinner returns a command that runs until d has passed, doing body (a
// bash command; "" for nothing) in a loop: a busy loop. Its deadline is
// kept by bash's EPOCHREALTIME builtin, so the loop makes no system call
// of its own, and ends in time even if nobody stops it.
func spinner(d time.Duration, body string) *exec.Cmd {
	if body == "" {
		body = ":"
	}
	script := fmt.Sprintf(`end=$(( ${EPOCHREALTIME/./} + %d )); while (( ${EPOCHREALTIME/./} < end )); do %s; done`, d.Microseconds(), body)
	cmd := exec.Command("bash", "-c", script)
	setDeathSignal(cmd)
	return cmd
}
