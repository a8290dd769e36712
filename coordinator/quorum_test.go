package coordinator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership/machine"
)

// noQuorumWarnings are the node's warnings that it holds back for lack of
// a quorum.
func noQuorumWarnings(logs *logCapture, node string) []logRecord {
	return logs.records(func(r logRecord) bool {
		return r.level == slog.LevelWarn && r.attrs["node"] == node && strings.HasPrefix(r.msg, "no quorum for StepDown")
	})
}

// Issue 11, defect 11: after a crash and then a graceful leave in a 3-node
// cluster (SIGKILL n3, later SIGTERM n2), the last node never claimed
// again: it still counted the leaver in its stable membership. A graceful
// leaver stops counting: the last node holds every partition, and Status
// says it has a quorum of the stable membership {itself}.
func TestCrashThenLeaveLastNodeKeepsQuorum(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	logs := newLogCapture()
	// A crash needs no grace here: the node is gone.
	tc := newTestCluster(t, func(c *Config) { c.Logger = slog.New(logs); c.Grace = c.StepDown + c.TickInterval })
	tc.startNodes(ctx, "q", 3)
	tc.remove("q2").c.Close() // a crash
	tc.waitConverged(ctx)
	if err := tc.remove("q1").c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	last := tc.node("q0")
	tc.waitConverged(ctx)
	// Well past StepDown: a node that counted the leaver would have ended
	// every lease by now.
	hold := time.NewTimer(4 * last.c.cfg.StepDown)
	<-hold.C
	st := last.c.Status()
	if !st.Quorum || !slices.Equal(st.Stable, []string{"q0"}) || st.Owned != testPartitions {
		t.Fatalf("last node: quorum %v, stable %v, owns %d of %d", st.Quorum, st.Stable, st.Owned, testPartitions)
	}
	if w := noQuorumWarnings(logs, "q0"); len(w) > 1 {
		t.Fatalf("the last node warned %d times about its quorum: %v", len(w), w)
	}
}

// Issue 11, defect 11: a node that holds back for lack of a quorum said
// nothing at Info or Warn, and Status had no quorum field. When two of
// three nodes crash at once, the survivor warns exactly once (not once a
// tick), and Status shows no quorum against the stable membership of all
// three, and why (NoQuorum).
func TestNoQuorumWarnsOnceAndStatusSaysWhy(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	logs := newLogCapture()
	tc := newTestCluster(t, func(c *Config) { c.Logger = slog.New(logs) })
	tc.startNodes(ctx, "r", 3)
	last := tc.node("r0")
	healthy := last.c.Status()
	if !healthy.Quorum || healthy.NoQuorum != "" || healthy.StableVersion == 0 || !slices.Equal(healthy.Stable, []string{"r0", "r1", "r2"}) {
		t.Fatalf("a healthy 3-node cluster: quorum %v (%q), stable %v (version %d)", healthy.Quorum, healthy.NoQuorum, healthy.Stable, healthy.StableVersion)
	}
	tc.remove("r1").c.Close()
	tc.remove("r2").c.Close()
	testkit.WaitFor(ctx, t, "the survivor to step down", func() bool { return last.c.ownedCount() == 0 })
	// Well past StepDown: the warning is not repeated.
	hold := time.NewTimer(4 * last.c.cfg.StepDown)
	<-hold.C
	st := last.c.Status()
	if st.Quorum || !slices.Equal(st.Stable, []string{"r0", "r1", "r2"}) || st.StableVersion != healthy.StableVersion {
		t.Fatalf("survivor of two crashes: quorum %v, stable %v (version %d, was %d)", st.Quorum, st.Stable, st.StableVersion, healthy.StableVersion)
	}
	if want := "reaches 1 of the 3 stable members, not a majority"; st.NoQuorum != want {
		t.Fatalf("survivor of two crashes says %q, want %q", st.NoQuorum, want)
	}
	if w := noQuorumWarnings(logs, "r0"); len(w) != 1 {
		t.Fatalf("the survivor warned %d times about its quorum, want once: %v", len(w), w)
	}
}

// manualClock is a Clock that moves only when told; its tickers never
// fire.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) NewTicker(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }

// Issue 11, defect 13: a quorum lost for a moment (a node sees a joiner's
// newer stable membership until it catches up, in every join) is not a
// warning; a quorum missing for StepDown is, once.
func TestQuorumWarningWaitsForStepDown(t *testing.T) {
	logs := newLogCapture()
	clock := &manualClock{now: time.Unix(1000, 0)}
	cfg := testConfig("n")
	cfg.Handler = HandlerFuncs{}
	cfg.Logger = slog.New(logs)
	cfg.Clock = clock
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := machine.NewMachine(c.cfg.machineConfig(c.self))
	if err != nil {
		t.Fatal(err)
	}
	l := newLoop(c, m)
	warnings := func() int { return len(noQuorumWarnings(logs, "n")) }
	l.quorum(true)
	l.quorum(false) // lost ...
	clock.advance(cfg.StepDown / 2)
	l.warnQuorum()
	l.quorum(true) // ... and regained within StepDown
	l.warnQuorum()
	if w := warnings(); w != 0 {
		t.Fatalf("a quorum lost for half of StepDown warned %d times", w)
	}
	l.quorum(false)
	clock.advance(cfg.StepDown)
	for range 5 {
		l.warnQuorum()
		clock.advance(cfg.StepDown)
	}
	if w := warnings(); w != 1 {
		t.Fatalf("a quorum missing for 6 x StepDown warned %d times, want once", w)
	}
	if st := c.Status(); st.Quorum {
		t.Fatal("Status reports a quorum it lost")
	}
}

// Status.NoQuorum's reasons, one per way a quorum can be missing, as its
// doc lists them.
func TestNoQuorumReasons(t *testing.T) {
	for _, c := range []struct {
		qs   machine.QuorumState
		want string
	}{
		{machine.QuorumState{OK: true, Reached: 3, Stable: 3, Members: 3}, ""},
		{machine.QuorumState{OK: true, Min: 1, Members: 1}, ""},
		{machine.QuorumState{}, "no stable membership yet"},
		{machine.QuorumState{Outdated: true, Members: 2}, "no stable membership yet: asking a member that shows one"},
		{machine.QuorumState{Min: 2, Members: 1}, "reaches 1 member, fewer than MinQuorum (2)"},
		{machine.QuorumState{Min: 3, Members: 2}, "reaches 2 members, fewer than MinQuorum (3)"},
		{machine.QuorumState{Reached: 1, Stable: 3, Members: 2}, "reaches 1 of the 3 stable members, not a majority (and 1 member outside it)"},
		{machine.QuorumState{Outdated: true, Reached: 3, Stable: 3, Members: 3}, "outdated: a member shows a newer stable membership, which this node is asking for"},
		{machine.QuorumState{Doubt: true, Reached: 3, Stable: 3, Members: 3}, "in doubt: it heard a newer stable membership of which it knows no quorum"},
		{machine.QuorumState{Reached: 2, Stable: 5, Members: 2}, "reaches 2 of the 5 stable members, not a majority"},
		{machine.QuorumState{Reached: 2, Stable: 5, Members: 4}, "reaches 2 of the 5 stable members, not a majority (and 2 members outside it)"},
	} {
		if got := noQuorumReason(c.qs); got != c.want {
			t.Errorf("%+v: %q, want %q", c.qs, got, c.want)
		}
	}
}
