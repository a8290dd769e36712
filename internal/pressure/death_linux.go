package pressure

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills cmd's process when the thread that started it
// exits, so a loop does not outlive a crashed caller by long.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
