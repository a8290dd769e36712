//go:build unix

package sigstop

import (
	"context"
	"database/sql"
	"fmt"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver of the lock probe
)

// stopTimeout bounds the wait for the kernel to report a process stopped.
const stopTimeout = 5 * time.Second

// Stop sends SIGSTOP to pid and waits until the process is stopped.
func Stop(ctx context.Context, pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	return waitStopped(ctx, pid)
}

// StopUnlocked stops pid (Stop) at a moment it holds no write lock on the
// SQLite file at path. A probe takes the lock with a short busy timeout;
// if it can't, the process runs on for a moment (SIGCONT) and is stopped
// again, up to 50 times.
func StopUnlocked(ctx context.Context, pid int, path string) error {
	probe, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(300)")
	if err != nil {
		return err
	}
	defer probe.Close()
	free := func() bool {
		conn, err := probe.Conn(ctx)
		if err != nil {
			return false
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return false
		}
		_, err = conn.ExecContext(ctx, "ROLLBACK")
		return err == nil
	}
	for range 50 {
		if err := Stop(ctx, pid); err != nil {
			return err
		}
		if free() {
			return nil
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			return err
		}
		sleep(ctx, 10*time.Millisecond)
	}
	return fmt.Errorf("process %d held the SQLite write lock at each of 50 stops", pid)
}

// sleep waits d unless ctx ends first.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
