package tenuretest

import (
	"sync"
	"time"
)

// pausableClock is the system clock whose tickers stop firing while it is
// paused, as a stopped process's timers do.
type pausableClock struct {
	mu     sync.Mutex
	paused bool
	done   chan struct{}
	once   sync.Once
}

func newPausableClock() *pausableClock { return &pausableClock{done: make(chan struct{})} }

func (c *pausableClock) Now() time.Time { return time.Now() }

func (c *pausableClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	out := make(chan time.Time)
	stop := make(chan struct{})
	var once sync.Once
	go func() {
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				c.mu.Lock()
				paused := c.paused
				c.mu.Unlock()
				if paused {
					continue
				}
				select {
				case out <- now:
				case <-stop:
					return
				case <-c.done:
					return
				}
			case <-stop:
				return
			case <-c.done:
				return
			}
		}
	}()
	return out, func() { once.Do(func() { close(stop) }) }
}

func (c *pausableClock) pause()  { c.mu.Lock(); c.paused = true; c.mu.Unlock() }
func (c *pausableClock) resume() { c.mu.Lock(); c.paused = false; c.mu.Unlock() }

// close ends every ticker's goroutine (the coordinator stops them on
// Close; this covers a coordinator that never started).
func (c *pausableClock) close() { c.once.Do(func() { close(c.done) }) }
