//go:build unix

package sigstop

import (
	"context"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// StopUnlocked returns with the process stopped (as wait4 reports it) when
// nothing holds the SQLite file's write lock, and SIGCONT resumes it.
func TestStopUnlocked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()

	if err := StopUnlocked(ctx, pid, filepath.Join(t.TempDir(), "probe.db")); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if got, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WNOHANG, nil); err != nil || got != pid || !ws.Stopped() {
		t.Fatalf("after StopUnlocked: wait4 = %d, %v, status %#x; want the process stopped", got, err, ws)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}
