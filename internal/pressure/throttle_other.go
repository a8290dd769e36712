//go:build !linux

package pressure

import (
	"context"
	"errors"
	"time"
)

var errNoCgroups = errors.New("pressure: a CPU quota needs Linux cgroups (cgroup v1 cpu.cfs_quota_us or cgroup v2 cpu.max)")

// Throttle is a cgroup with a CPU quota (Linux only).
type Throttle struct{ Percent int }

// Stat is what the kernel counted for a throttle's group.
type Stat struct {
	Periods, Throttled int64
	Waited             time.Duration
}

// NewThrottle returns an error: there are no cgroups here.
func NewThrottle(int) (*Throttle, error) { return nil, errNoCgroups }

func (t *Throttle) Add(int) error       { return errNoCgroups }
func (t *Throttle) Stat() (Stat, error) { return Stat{}, errNoCgroups }
func (t *Throttle) Close() error        { return nil }

// Throttled returns an error: there are no cgroups here.
func Throttled(context.Context, int, int, time.Duration) (Stat, error) { return Stat{}, errNoCgroups }
