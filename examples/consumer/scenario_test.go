package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/tenure-go/tenure/coordinator"
	"github.com/tenure-go/tenure/examples/consumer/consumer"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/transport/faultnet"
)

// runScenario runs sc with a bounded context and fails the test if the
// run could not complete.
func runScenario(t *testing.T, sc Scenario) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sc.Progress = testWriter{t}
	res, err := sc.Run(ctx)
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	return res
}

// checkExactlyOnce fails the test unless every event was applied exactly
// once and the held batch's commit was rejected by the fence.
func checkExactlyOnce(t *testing.T, res Result, events int) {
	t.Helper()
	if err := res.Err(); err != nil {
		t.Errorf("%v (report %+v)", err, res.Report)
	}
	if res.Events != events || res.Applications != events {
		t.Errorf("%d events in the log, %d applications; want %d of each", res.Events, res.Applications, events)
	}
	if res.Rejected < 1 {
		t.Errorf("no commit was rejected; the held batch's should have been")
	}
	var stale *ownership.StaleTokenError
	if !errors.As(res.PausedErr, &stale) || stale.Token != res.Paused.Token || stale.Current.Owner == "node-1" {
		t.Errorf("held commit under %v returned %v; want a stale-token error naming another owner", res.Paused.Token, res.PausedErr)
	}
}

// TestFigures runs the scenario on SQLite: ownership moves in the middle
// of a batch, the stale owner's commit is rejected, and every event is
// applied exactly once. It prints the figures.
func TestFigures(t *testing.T) {
	res := runScenario(t, Scenario{DB: openSQLite(t), Dialect: sqlfence.SQLite(), Events: 900})
	checkExactlyOnce(t, res, 900)
	res.WriteFigures(os.Stdout)
}

// The same scenario on PostgreSQL, where different partitions commit in
// parallel.
func TestScenarioPostgres(t *testing.T) {
	res := runScenario(t, Scenario{DB: openPostgres(t), Dialect: sqlfence.Postgres(), Events: 900, Seed: 7})
	checkExactlyOnce(t, res, 900)
}

// The negative control: the same scenario, but the held batch is
// committed without the fence. Its late commit goes through, applies its
// events a second time and moves the offset back, and the checks must say
// so.
func TestUnfencedCommitsAreCaught(t *testing.T) {
	res := runScenario(t, Scenario{DB: openSQLite(t), Dialect: sqlfence.SQLite(), Events: 600, Unfenced: true})
	if res.PausedErr != nil {
		t.Fatalf("the unfenced held commit returned %v; want it to go through", res.PausedErr)
	}
	if res.DoubleApplied < len(res.Paused.Events) || res.BadBalances == 0 {
		t.Errorf("report %+v: want the %d events of the held batch applied twice and wrong balances", res.Report, len(res.Paused.Events))
	}
	if res.Err() == nil {
		t.Errorf("Result.Err is nil for a run that applied events twice")
	}
}

// testWriter sends the scenario's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// A graceful Leave in the middle of consumption hands every partition off
// after the batch in hand: no commit is rejected, and every event is
// applied exactly once.
//
// The promise holds when each partition's drain (the batch in hand, then
// Release) ends within ReleaseTimeout. The leave comes while all 16
// partitions commit their first batches, and SQLite takes one writer at a
// time: under -race on two busy cores a commit has waited more than the
// local preset's 2 s for the write lock (and a fence past its
// AcquireTimeout), so these nodes get 10 s for both; New raises
// their HandoffTimeout to match, so the new owners wait for such a drain
// instead of fencing it (TestLeaveWaitsForADrainWithinReleaseTimeout).
func TestLeaveRejectsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sc, err := Scenario{DB: openSQLite(t), Dialect: sqlfence.SQLite(), tune: func(c *coordinator.Config) {
		c.ReleaseTimeout, c.AcquireTimeout = 10*time.Second, 10*time.Second
	}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, sc.DB, sc.Dialect)
	network := faultnet.New()
	var nodes []*consumer.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for _, name := range []string{"a", "b", "c"} {
		n, err := sc.startNode(ctx, store, network, name, nodes, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	if err := converged(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	table := nodes[0].Coordinator().Table()
	produce := func(from, to int) {
		t.Helper()
		var events []consumer.Event
		for i := from; i < to; i++ {
			key := fmt.Sprintf("k%d", i%37)
			events = append(events, consumer.Event{Partition: uint32(table.PartitionString(key)), Key: key, Amount: int64(i)})
		}
		if _, err := store.Append(ctx, events...); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, 400)
	leaver := nodes[2]
	err = poll(ctx, "the leaver to consume", func() (bool, error) { return leaver.Stats().Events > 0, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := leaver.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	nodes = nodes[:2]
	produce(400, 800)
	if err := converged(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, "the log to be consumed", func() (bool, error) {
		lag, err := store.Lag(ctx)
		return lag == 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var rejected int64
	for _, n := range append(nodes, leaver) {
		n.Close()
		rejected += n.Stats().Rejected
	}
	nodes = nil
	r, err := store.Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Err() != nil || r.Events != 800 || rejected != 0 {
		t.Errorf("report %+v (%v), %d commits rejected; want 800 events applied once and none rejected", r, r.Err(), rejected)
	}
}
