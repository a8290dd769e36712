package sigstop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"
)

// waitStopped waits until the kernel reports pid stopped (state T in
// /proc/<pid>/stat).
func waitStopped(ctx context.Context, pid int) error {
	deadline := time.Now().Add(stopTimeout)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return err
		}
		// "pid (comm) S ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop within %v of SIGSTOP", pid, stopTimeout)
		}
		sleep(ctx, time.Millisecond)
	}
}
