package ownership

import "time"

// Clock is a source of time: the coordinator's (coordinator.Config.Clock)
// and a Batcher's (sqlfence.BatchConfig.Clock), so one clock can serve
// both. The default is the system clock; tests inject their own to run
// timers fast, slow, or with jumps.
type Clock interface {
	Now() time.Time
	// NewTicker returns a channel that receives at every interval d (d > 0)
	// and a function that stops it.
	NewTicker(d time.Duration) (<-chan time.Time, func())
}

// SystemClock returns the real clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}
