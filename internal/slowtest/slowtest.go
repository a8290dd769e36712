package slowtest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// MaxFactor bounds the measured factor: past it a wait would outlast the
// test binary's own timeout rather than help.
const MaxFactor = 8

// EnvVar names the environment variable that sets the factor instead of
// the measurement: a number, at least 1.
const EnvVar = "TENURE_SLOW"

// Factor is how many times longer than on an idle machine a wait may take
// now: TENURE_SLOW if it is set to a number of at least 1, else the
// 1-minute load average per CPU, clamped to [1, MaxFactor]. A machine
// whose load can't be read counts as idle.
func Factor() float64 {
	f, _ := factor()
	return f
}

// factor returns the factor and where it came from.
func factor() (float64, string) {
	if v := os.Getenv(EnvVar); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 1 {
			return f, EnvVar + "=" + v
		}
	}
	load, err := loadAverage()
	if err != nil {
		return 1, "load unknown"
	}
	return min(max(load/float64(runtime.NumCPU()), 1), MaxFactor), "measured"
}

// loadAverage returns the 1-minute load average (Linux's /proc/loadavg).
func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0, fmt.Errorf("slowtest: /proc/loadavg is empty")
	}
	return strconv.ParseFloat(fields[0], 64)
}

// Scale returns d times Factor.
func Scale(d time.Duration) time.Duration { return time.Duration(float64(d) * Factor()) }

// WithTimeout is context.WithTimeout with d scaled by Factor, measured
// now: the deadline of a wait for a cluster to converge.
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, Scale(d))
}

// Describe says how busy the machine is, for the message of a wait that
// timed out: "load average 0.52 0.58 0.59 1/389 12345, 2 CPUs, slow factor
// 1.00 (measured)".
func Describe() string {
	f, from := factor()
	load := "load unknown"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = "load average " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d CPUs, slow factor %.2f (%s)", load, runtime.NumCPU(), f, from)
}

// Lag measures how late a polling loop runs: the loop calls Tick at each
// turn, and Max is the longest a turn came after the interval it was
// due. The zero Lag is ready; Interval is the loop's period.
type Lag struct {
	Interval time.Duration
	last     time.Time
	max      time.Duration
}

// Tick records a turn of the loop at now.
func (l *Lag) Tick(now time.Time) {
	if !l.last.IsZero() {
		l.max = max(l.max, now.Sub(l.last)-l.Interval)
	}
	l.last = now
}

// Max is the longest a turn came late.
func (l *Lag) Max() time.Duration { return l.max }
