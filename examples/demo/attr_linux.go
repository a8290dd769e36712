package main

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"time"
)

// childAttr puts a node in its own process group (a Ctrl-C reaches the demo,
// which stops its nodes itself) and has the kernel kill it if the demo dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitStopped waits until the kernel reports pid stopped (state T): kill
// returns before every thread of the process has stopped.
func waitStopped(pid int) error {
	deadline := time.Now().Add(2 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return err
		}
		// "pid (comm) S ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not stop", pid)
		}
		<-tick.C
	}
}
