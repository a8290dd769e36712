//go:build !linux

package kvnode

import "context"

// crossQueue orders writers between processes on Linux only; elsewhere the
// nodes sharing a SQLite file take turns within each process, and SQLite's
// busy handler decides between them.
type crossQueue struct{}

func openCrossQueue(string) (*crossQueue, error) { return nil, nil }

func (*crossQueue) acquire(context.Context) (func(), error) { return func() {}, nil }

func (*crossQueue) close() error { return nil }
