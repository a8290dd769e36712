package slowtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TENURE_SLOW sets the factor; a value that is not a number of at least 1
// leaves it to the measurement, which is never below 1 nor above
// MaxFactor.
func TestFactor(t *testing.T) {
	t.Setenv(EnvVar, "3")
	if got := Factor(); got != 3 {
		t.Errorf("Factor with %s=3 = %v, want 3", EnvVar, got)
	}
	if got := Scale(10 * time.Second); got != 30*time.Second {
		t.Errorf("Scale(10s) with %s=3 = %v, want 30s", EnvVar, got)
	}
	ctx, cancel := WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) <= 10*time.Second {
		t.Errorf("WithTimeout(10s) with %s=3: deadline in %v, want about 30s", EnvVar, time.Until(dl))
	}
	if d := Describe(); !strings.Contains(d, "slow factor 3.00 ("+EnvVar+"=3)") || !strings.Contains(d, "load average") {
		t.Errorf("Describe = %q, want the load and the factor from %s", d, EnvVar)
	}
	for _, v := range []string{"0.5", "x", ""} {
		t.Setenv(EnvVar, v)
		f, from := factor()
		if from != "measured" || f < 1 || f > MaxFactor {
			t.Errorf("%s=%q: factor %v (%s), want a measured one in [1, %d]", EnvVar, v, f, from, MaxFactor)
		}
	}
}

// Lag is the longest gap past the interval between two turns.
func TestLag(t *testing.T) {
	l := Lag{Interval: 10 * time.Millisecond}
	t0 := time.Now()
	for _, at := range []time.Duration{0, 10, 20, 150, 160} {
		l.Tick(t0.Add(at * time.Millisecond))
	}
	if l.Max() != 120*time.Millisecond {
		t.Errorf("Max = %v, want 120ms (a turn 130 ms after the last, due after 10)", l.Max())
	}
}
