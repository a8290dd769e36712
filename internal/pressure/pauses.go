//go:build unix

package pressure

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/internal/sigstop"
)

// PauseConfig shapes micro-pauses.
type PauseConfig struct {
	// For is how long the pauses go on, at most MaxDuration. Required.
	For time.Duration
	// Min and Max bound each pause, drawn uniformly between them.
	// Default 50 ms and 500 ms.
	Min, Max time.Duration
	// Run is the mean time the process runs between pauses, drawn
	// uniformly between half and one and a half times it. Default 500 ms.
	Run time.Duration
	// Rand draws the pauses and the runs between them: seed it, so a run
	// can be repeated. Required.
	Rand *rand.Rand
}

func (c PauseConfig) withDefaults() (PauseConfig, error) {
	if c.Min == 0 && c.Max == 0 {
		c.Min, c.Max = 50*time.Millisecond, 500*time.Millisecond
	}
	if c.Run == 0 {
		c.Run = 500 * time.Millisecond
	}
	switch {
	case c.For <= 0 || c.For > MaxDuration:
		return c, fmt.Errorf("pressure: pauses for %v, want more than 0 and at most %v", c.For, MaxDuration)
	case c.Min <= 0 || c.Max < c.Min:
		return c, fmt.Errorf("pressure: pauses of %v to %v, want 0 < Min <= Max", c.Min, c.Max)
	case c.Max > c.For || c.Run < 0:
		return c, fmt.Errorf("pressure: a pause (%v) longer than the run of pauses (%v), or a negative Run", c.Max, c.For)
	case c.Rand == nil:
		return c, errors.New("pressure: PauseConfig.Rand is nil: give a seeded source")
	}
	return c, nil
}

// Pause is one stop of a process: from when the kernel reported it
// stopped to when SIGCONT was sent.
type Pause struct {
	Stopped, Continued time.Time
}

// Pauses stops process pid again and again (SIGSTOP, waiting until the
// kernel reports it stopped, then SIGCONT after the pause) for cfg.For or
// until ctx ends, and returns the pauses it made. No pause starts after
// For has passed, and the process is running when Pauses returns, even on
// error. pid must be another process's: 0, a negative pid (a process
// group) and this process's own are refused.
func Pauses(ctx context.Context, pid int, cfg PauseConfig) ([]Pause, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pid <= 0 || pid == os.Getpid() {
		// kill(2) reads 0 and negative pids as process groups (-1: every
		// process), and stopping this process leaves none to continue it.
		return nil, fmt.Errorf("pressure: pause process %d: want the pid of another process", pid)
	}
	end := time.Now().Add(cfg.For)
	var out []Pause
	for {
		run := cfg.Run/2 + time.Duration(cfg.Rand.Int64N(int64(cfg.Run)+1))
		pause := cfg.Min + time.Duration(cfg.Rand.Int64N(int64(cfg.Max-cfg.Min)+1))
		if !sleepUntil(ctx, time.Now().Add(run)) || time.Now().Add(pause).After(end) {
			return out, nil
		}
		if err := sigstop.Stop(ctx, pid); err != nil {
			return out, errors.Join(fmt.Errorf("pressure: stop process %d: %w", pid, err), cont(pid))
		}
		p := Pause{Stopped: time.Now()}
		sleepUntil(ctx, p.Stopped.Add(pause))
		p.Continued = time.Now()
		if err := cont(pid); err != nil {
			return out, err
		}
		out = append(out, p)
	}
}

// cont sends SIGCONT to pid.
func cont(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("pressure: continue process %d: %w", pid, err)
	}
	return nil
}

// sleepUntil waits until t, or returns false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
