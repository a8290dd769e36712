//go:build unix && !linux

package pressure

import "os/exec"

// setDeathSignal does nothing where there is no parent-death signal: the
// loop ends by itself.
func setDeathSignal(*exec.Cmd) {}
