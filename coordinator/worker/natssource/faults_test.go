package natssource_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/coordinator/worker/natssource"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// faultCounts is what a run through the faults saw.
type faultCounts struct {
	report      worker.Report
	pausedStale int64 // commits of the paused node the fence refused
	blocked     int32 // batches the paused node had in hand
	leaverStale int64 // commits of the leaving node refused
}

// runFaults consumes a stream on 3 nodes through a pause past the lease
// in the middle of a batch, a crash and restart, and a graceful leave,
// with events published between them. Each step publishes perStep events.
func runFaults(t *testing.T, ctx context.Context, parts, batch, perStep int) faultCounts {
	t.Helper()
	b := newBroker(t, ctx, parts, 16)
	cs := startConsumers(t, ctx, b, 3, batch)
	cl := cs.Cl
	t0 := time.Now()
	step := func(what string, err error) {
		t.Helper()
		t.Logf("%v %s", time.Since(t0).Round(time.Millisecond), what)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	step("publish", b.produce(ctx, perStep))
	b.waitConsumed(ctx, t)
	step("consumed", nil)

	// Pause node-2, its handler frozen with batches fetched but not committed.
	h := cs.Holds["node-2"]
	h.Freeze()
	step("pause", cl.Pause("node-2"))
	step("publish", b.produce(ctx, perStep))
	tenuretest.WaitFor(ctx, t, "a batch in hand on the paused node", func() bool { return h.Blocked.Load() >= 1 })
	step("fail over", cl.WaitConverged(ctx, "node-0", "node-1"))
	b.waitConsumed(ctx, t)
	step("consumed", nil)
	var fc faultCounts
	rt2 := cs.RT("node-2")
	before := rt2.Stats().Stale
	fc.blocked = h.Blocked.Load()
	h.Thaw() // the batches in hand commit under the old leases
	tenuretest.WaitFor(ctx, t, "the paused node's commits refused", func() bool {
		return rt2.Stats().Stale-before >= int64(fc.blocked)
	})
	fc.pausedStale = rt2.Stats().Stale - before
	step("resume", cl.Resume("node-2"))
	step("converge after resume", cl.WaitConverged(ctx))
	step("publish", b.produce(ctx, perStep))
	b.waitConsumed(ctx, t)
	step("consumed", nil)

	// A crash and a restart.
	step("crash", cl.Crash("node-1"))
	step("publish", b.produce(ctx, perStep))
	step("converge after crash", cl.WaitConverged(ctx))
	b.waitConsumed(ctx, t)
	step("consumed", nil)
	step("restart", cl.Restart(ctx, "node-1"))
	step("converge after restart", cl.WaitConverged(ctx))
	step("publish", b.produce(ctx, perStep))

	// A graceful leave while events flow.
	rt0 := cs.RT("node-0")
	step("leave", cl.Leave(ctx, "node-0"))
	fc.leaverStale = rt0.Stats().Stale
	step("publish", b.produce(ctx, perStep))
	step("converge after leave", cl.WaitConverged(ctx))
	b.waitConsumed(ctx, t)
	step("consumed", nil)
	fc.report = b.check(ctx, t)
	return fc
}

// Every event published to JetStream, partitioned by
// ring.PartitionString, is applied to PostgreSQL exactly once and in
// stream order per partition, through a pause past the lease mid-batch
// (whose commits the fence refuses), a crash and a graceful leave.
func TestExactlyOnceThroughFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fc := runFaults(t, ctx, 8, 4, 80)
	if err := fc.report.Err(); err != nil {
		t.Error(err)
	}
	if want := 6 * 80; fc.report.Produced != want || fc.report.Applied != want {
		t.Errorf("published %d, applied %d; want %d each", fc.report.Produced, fc.report.Applied, want)
	}
	if fc.pausedStale < int64(fc.blocked) || fc.blocked == 0 {
		t.Errorf("paused node: %d batches in hand, %d commits refused; want at least as many refused, and not 0", fc.blocked, fc.pausedStale)
	}
	if fc.leaverStale != 0 {
		t.Errorf("the leaving node had %d commits refused, want 0: a graceful leave drains the batches in hand", fc.leaverStale)
	}
}

// A batch fetched again from the same offset and committed twice (the
// redelivery a lost answer leads to) is applied once: the second commit
// fails with ErrOffsetMoved and writes nothing. The negative control
// applies the second one anyway, and the checker sees the duplicate.
func TestRedeliveryAppliedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newBroker(t, ctx, 4, 4)
	if err := b.produce(ctx, 20); err != nil {
		t.Fatal(err)
	}
	p := b.produced[0].Partition
	fk, err := tenuretest.NewFake(tenuretest.FakeConfig{Partitions: 4, Fence: b.fence, Handler: nopHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := fk.Grant(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	src, err := natssource.New(natssource.Config{Stream: b.stream, Prefix: b.prefix, DB: b.db, Fence: b.fence, Offsets: b.offsets, Batch: 5, Apply: apply})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Stop(lease, nil)
	first, err := src.Fetch(ctx, lease)
	if err != nil || len(first.Msgs) == 0 {
		t.Fatalf("fetch: %d messages, %v", len(first.Msgs), err)
	}
	again, err := src.Fetch(ctx, lease) // the offset has not moved: the same batch
	if err != nil || again.From != first.From || again.Next != first.Next {
		t.Fatalf("fetch again: [%d, %d) %v, want [%d, %d)", again.From, again.Next, err, first.From, first.Next)
	}
	if err := src.Commit(ctx, lease, first); err != nil {
		t.Fatal(err)
	}
	if err := src.Commit(ctx, lease, again); !errors.Is(err, sqlfence.ErrOffsetMoved) {
		t.Fatalf("the second commit of the batch: %v, want ErrOffsetMoved", err)
	}
	applied, err := countApplied(ctx, b)
	if err != nil || applied != len(first.Msgs) {
		t.Fatalf("%d rows applied (%v), want %d", applied, err, len(first.Msgs))
	}
	// The next fetch starts after the batch.
	next, err := src.Fetch(ctx, lease)
	if err != nil || next.From != first.Next {
		t.Fatalf("next fetch from %d (%v), want %d", next.From, err, first.Next)
	}
	last := seqOf(t, first.Msgs[len(first.Msgs)-1])
	for _, m := range next.Msgs {
		if s := seqOf(t, m); s <= last {
			t.Errorf("the next batch holds sequence %d, already applied (the batch before ended at %d)", s, last)
		}
	}
	// Negative control: the same batch applied without the offset's
	// compare-and-set is a duplicate the checker reports.
	if err := b.fence.DoConn(ctx, lease.Token(), ownership.Exact, func(tx sqlfence.Tx) error { return apply(ctx, tx, p, again.Msgs) }); err != nil {
		t.Fatal(err)
	}
	if r := b.check(ctx, t); r.Duplicates != len(again.Msgs) {
		t.Errorf("checker: %+v, want %d duplicates", r, len(again.Msgs))
	}
}

// nopHandler serves nothing: the test calls the Source itself.
type nopHandler struct{}

func (nopHandler) Acquire(context.Context, *ownership.Lease) error { return nil }
func (nopHandler) Release(context.Context, *ownership.Lease) error { return nil }

func countApplied(ctx context.Context, b *broker) (int, error) {
	var n int
	err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM applied`).Scan(&n)
	return n, err
}

func seqOf(t *testing.T, m jetstream.Msg) uint64 {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md.Sequence.Stream
}

// Messages the server delivered to the Source's consumer that the Source
// never saw (a fetch that gave up on the client before they arrived: the
// client ends a fetch that hears nothing for a second without an error,
// and an ack-less consumer has moved past what it sent) are read again
// from the committed offset, not skipped. Here another client takes them
// from the consumer, as the inbox of a fetch that gave up does. (Before,
// the Source went on with its consumer from where the server was: the
// taken messages were never applied.)
func TestDeliveriesLostInTransitAreReadAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newBroker(t, ctx, 2, 4)
	if err := b.produce(ctx, 30); err != nil {
		t.Fatal(err)
	}
	p := b.produced[0].Partition
	var want []string
	for _, r := range b.produced {
		if r.Partition == p {
			want = append(want, r.ID)
		}
	}
	if len(want) < 6 {
		t.Fatalf("p%d has %d events, want at least 6", p, len(want))
	}
	fk, err := tenuretest.NewFake(tenuretest.FakeConfig{Partitions: 2, Fence: b.fence, Handler: nopHandler{}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := fk.Grant(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	src, err := natssource.New(natssource.Config{Stream: b.stream, Prefix: b.prefix, DB: b.db, Fence: b.fence, Offsets: b.offsets, Batch: 2, Apply: apply})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Stop(lease, nil)
	if n, err := src.Process(ctx, lease); err != nil || n != 2 {
		t.Fatalf("first batch: %d, %v", n, err)
	}
	// Two deliveries of the Source's consumer go elsewhere.
	names := b.stream.ConsumerNames(ctx)
	var name string
	for n := range names.Name() {
		name = n
	}
	if err := names.Err(); err != nil || name == "" {
		t.Fatalf("the Source's consumer: %q, %v", name, err)
	}
	cons, err := b.stream.Consumer(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cons.FetchNoWait(2)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for range res.Messages() {
		lost++
	}
	if lost != 2 {
		t.Fatalf("%d deliveries taken, want 2", lost)
	}
	for i := 0; ; i++ {
		n, err := src.Process(ctx, lease)
		if err == nil && n == 0 {
			break
		}
		if i > 3*len(want) {
			t.Fatalf("partition not consumed after %d batches (last: %d, %v)", i, n, err)
		}
	}
	var got []string
	rows, err := b.db.QueryContext(ctx, `SELECT stream_seq FROM applied WHERE partition_id = $1 ORDER BY seq`, int64(p))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var produced, applied []worker.Record
	for _, id := range want {
		produced = append(produced, worker.Record{Partition: p, ID: id})
	}
	for _, id := range got {
		applied = append(applied, worker.Record{Partition: p, ID: id})
	}
	if err := worker.Check(produced, applied).Err(); err != nil {
		t.Fatal(err)
	}
}
