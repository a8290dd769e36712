//go:build unix && !linux

package main

import "syscall"

// childAttr puts a node in its own process group (a Ctrl-C reaches the demo,
// which stops its nodes itself).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
