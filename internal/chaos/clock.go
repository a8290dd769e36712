package chaos

import (
	"sync"
	"time"
)

// SkewClock is a coordinator.Clock whose time runs at an adjustable rate
// relative to the real clock and can jump. Its tickers follow the rate: at
// rate 2 a ticker of interval d fires every d/2 of real time, at rate 0.5
// every 2d. A forward jump of at least a ticker's interval makes that ticker
// fire at once (a clock stepping forward catches its timers up).
//
// SkewClock is safe for concurrent use; the zero value is not: use
// NewSkewClock.
type SkewClock struct {
	mu      sync.Mutex
	rate    float64
	realAt  time.Time // real time of the last rebase
	clockAt time.Time // this clock's time at realAt
	tickers map[*skewTicker]struct{}
}

type skewTicker struct {
	d    time.Duration
	ch   chan time.Time
	kick chan struct{} // cap 1: the rate changed or the clock jumped
	quit chan struct{}
	done chan struct{}
	jump time.Duration // pending forward jump, under SkewClock.mu
}

// NewSkewClock returns a clock at rate 1 that reads the real time.
func NewSkewClock() *SkewClock {
	now := time.Now()
	return &SkewClock{rate: 1, realAt: now, clockAt: now, tickers: map[*skewTicker]struct{}{}}
}

// Now returns the clock's current time.
func (c *SkewClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nowLocked(time.Now())
}

func (c *SkewClock) nowLocked(real time.Time) time.Time {
	return c.clockAt.Add(time.Duration(float64(real.Sub(c.realAt)) * c.rate))
}

// SetRate makes the clock run at rate times real time from now on (rate is
// clamped to [0.01, 100]).
func (c *SkewClock) SetRate(rate float64) {
	rate = min(max(rate, 0.01), 100)
	c.mu.Lock()
	real := time.Now()
	c.clockAt, c.realAt, c.rate = c.nowLocked(real), real, rate
	for t := range c.tickers {
		t.poke()
	}
	c.mu.Unlock()
}

// Rate returns the current rate.
func (c *SkewClock) Rate() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rate
}

// Jump moves the clock by d (forward when positive, back when negative).
func (c *SkewClock) Jump(d time.Duration) {
	c.mu.Lock()
	c.clockAt = c.clockAt.Add(d)
	if d > 0 {
		for t := range c.tickers {
			t.jump += d
			t.poke()
		}
	}
	c.mu.Unlock()
}

// NewTicker implements coordinator.Clock.
func (c *SkewClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		d = time.Millisecond
	}
	t := &skewTicker{
		d:    d,
		ch:   make(chan time.Time, 1),
		kick: make(chan struct{}, 1),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	c.mu.Lock()
	c.tickers[t] = struct{}{}
	c.mu.Unlock()
	go c.runTicker(t)
	var once sync.Once
	return t.ch, func() {
		once.Do(func() {
			close(t.quit)
			<-t.done
			c.mu.Lock()
			delete(c.tickers, t)
			c.mu.Unlock()
		})
	}
}

func (t *skewTicker) poke() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// runTicker fires t every t.d of clock time.
func (c *SkewClock) runTicker(t *skewTicker) {
	defer close(t.done)
	// left is the clock time still to run before the next tick.
	left := t.d
	for {
		c.mu.Lock()
		rate := c.rate
		c.mu.Unlock()
		wait := time.Duration(float64(left) / rate)
		timer := time.NewTimer(wait)
		started := time.Now()
		select {
		case <-t.quit:
			timer.Stop()
			return
		case <-timer.C:
			left = t.d
			t.fire(c)
		case <-t.kick:
			timer.Stop()
			ran := time.Duration(float64(time.Since(started)) * rate)
			left = max(left-ran, 0)
			c.mu.Lock()
			jump := t.jump
			t.jump = 0
			c.mu.Unlock()
			if jump >= left {
				left = t.d
				t.fire(c)
			} else {
				left -= jump
			}
		}
	}
}

func (t *skewTicker) fire(c *SkewClock) {
	select {
	case t.ch <- c.Now():
	default: // like time.Ticker: a slow reader misses ticks
	}
}
