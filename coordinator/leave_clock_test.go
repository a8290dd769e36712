package coordinator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
	"github.com/tenure-go/tenure/ownership"
)

// refusingAuthority passes claims to a until refuse is set, then refuses
// them, as a database that a new owner can't reach would.
type refusingAuthority struct {
	a      ownership.Authority
	refuse atomic.Bool
}

func (r *refusingAuthority) Strict() bool { return r.a.Strict() }

func (r *refusingAuthority) Claim(ctx context.Context, p uint32, n ownership.Node, seen ownership.Token) (ownership.Token, error) {
	if r.refuse.Load() {
		return ownership.Token{}, errors.New("test: claims refused")
	}
	return r.a.Claim(ctx, p, n, seen)
}

// leapClock is the system clock until leap is set; from then on each Now
// is a minute later than the one before, so an hour passes in sixty
// readings.
type leapClock struct {
	mu   sync.Mutex
	leap bool
	off  time.Duration
}

func (c *leapClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leap {
		c.off += time.Minute
	}
	return time.Now().Add(c.off)
}

func (c *leapClock) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	return SystemClock().NewTicker(d)
}

func (c *leapClock) start() {
	c.mu.Lock()
	c.leap = true
	c.mu.Unlock()
}

// Leave waits for the new holders at most HandoffTimeout by the
// coordinator's Clock, not the wall clock: with the new owner unable to
// claim and HandoffTimeout an hour, a leaver whose clock runs fast gives up
// the wait within the test. Before the fix the wait took an hour of wall
// time and the test's context ended first.
func TestLeaveHandoffDeadlineFollowsTheClock(t *testing.T) {
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	f, _ := sqliteFence(t)
	auth := &refusingAuthority{a: f.Authority()}
	clock := &leapClock{}
	tc := newTestCluster(t, func(c *Config) {
		c.Authority = auth
		c.HandoffTimeout = time.Hour
		c.MinQuorum = 1            // n0 keeps its leases however slow the machine
		c.Grace = 10 * time.Minute // nothing is taken over for a crash meanwhile
		if c.Name == "n0" {
			c.Clock = clock
		}
	})
	tc.startNodes(ctx, "n", 2)
	auth.refuse.Store(true) // n1 can't claim what n0 hands off
	clock.start()
	leaver := tc.remove("n0")
	// The Leave's own bound, well under the mutants' limit: the wait given
	// up by the fast clock ends within a few of the loop's ticks.
	lctx, lcancel := slowtest.WithTimeout(ctx, 10*time.Second)
	defer lcancel()
	if err := leaver.c.Leave(lctx); err != nil {
		t.Fatalf("Leave with HandoffTimeout an hour by a clock that passes it in a moment: %v; want nil, the wait given up at the clock's deadline", err)
	}
}
