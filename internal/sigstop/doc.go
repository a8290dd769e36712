// Package sigstop stops a process with SIGSTOP for a pause test, and
// waits until it has really stopped.
//
// Stop sends SIGSTOP and waits until the kernel reports the process
// stopped: kill returns before every thread of the process has stopped.
// StopUnlocked also makes sure, when the process shares a SQLite file with
// others, that it was not stopped inside a write transaction: that would
// hold the file's write lock and stop every other writer with it, the new
// owners' fences included.
//
// The demo (examples/demo) and the chaos suite (internal/chaos) pause
// their child processes with it.
package sigstop
