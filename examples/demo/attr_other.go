//go:build unix && !linux

package main

import "syscall"

// childAttr puts a node in its own process group (a Ctrl-C reaches the demo,
// which stops its nodes itself).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitStopped is a no-op where the demo can't read a process's state: the
// stop lands within microseconds of kill returning.
func waitStopped(pid int) error { return nil }
