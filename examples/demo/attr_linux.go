package main

import "syscall"

// childAttr puts a node in its own process group (a Ctrl-C reaches the demo,
// which stops its nodes itself) and has the kernel kill it if the demo dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
