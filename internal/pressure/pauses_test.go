//go:build unix

package pressure

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A child that writes the time as fast as it can, paused at random: no
// time it wrote falls inside a pause (it made no progress while stopped),
// it wrote between the pauses (it was continued), and it ran to its end.
func TestPausesStopTheProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := filepath.Join(t.TempDir(), "stamps")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	child := spinner(3*time.Second, `echo $EPOCHREALTIME`)
	child.Stdout = f
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	pauses, err := Pauses(ctx, child.Process.Pid, PauseConfig{For: 2 * time.Second, Min: 50 * time.Millisecond,
		Max: 250 * time.Millisecond, Run: 200 * time.Millisecond, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("the paused child did not run to its end: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var stamps []int64 // microseconds
	for _, l := range strings.Fields(string(b)) {
		us, err := strconv.ParseInt(strings.Replace(l, ".", "", 1), 10, 64)
		if err != nil {
			t.Fatalf("stamp %q: %v", l, err)
		}
		stamps = append(stamps, us)
	}
	if len(pauses) < 3 {
		t.Fatalf("%d pauses in 2 s; want several", len(pauses))
	}
	for i, p := range pauses {
		from, to := p.Stopped.UnixMicro(), p.Continued.UnixMicro()
		if to-from < 50_000 {
			t.Errorf("pause %d lasted %v, less than Min", i, p.Continued.Sub(p.Stopped))
		}
		var during, after int
		for _, s := range stamps {
			if s > from && s < to {
				during++
			}
			if s >= to && (i+1 == len(pauses) || s < pauses[i+1].Stopped.UnixMicro()) {
				after++
			}
		}
		if during > 0 {
			t.Errorf("pause %d (%v): the child wrote %d stamps while stopped", i, p.Continued.Sub(p.Stopped), during)
		}
		if after == 0 {
			t.Errorf("pause %d: the child wrote nothing after it; was it continued?", i)
		}
	}
}

// Pauses refuses what it can't bound.
func TestPausesConfig(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []PauseConfig{
		{For: 0, Rand: r},
		{For: MaxDuration + 1, Rand: r},
		{For: time.Second},
		{For: time.Second, Min: 200 * time.Millisecond, Max: 100 * time.Millisecond, Rand: r},
		{For: 100 * time.Millisecond, Rand: r}, // a pause of up to 500 ms
	} {
		if _, err := Pauses(context.Background(), os.Getpid(), c); err == nil {
			t.Errorf("Pauses(%+v) succeeded", c)
		}
	}
}

// Pauses refuses a pid that is not one other process: 0 and negative pids
// name process groups to kill(2) (0 this process's own group, -1 every
// process the caller may signal) and this process's own pid would stop
// the caller, with nobody left to send SIGCONT.
func TestPausesRefusesPidsThatAreNotAnotherProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := PauseConfig{For: 300 * time.Millisecond, Min: 50 * time.Millisecond, Max: 50 * time.Millisecond,
		Run: 20 * time.Millisecond, Rand: rand.New(rand.NewPCG(1, 2))}
	for _, pid := range []int{0, os.Getpid(), -1, -os.Getpid()} {
		if pauses, err := Pauses(ctx, pid, cfg); err == nil {
			t.Errorf("Pauses(pid %d) made %d pauses, want an error", pid, len(pauses))
		}
	}
}
