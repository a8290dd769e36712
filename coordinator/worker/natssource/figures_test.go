package natssource_test

import (
	"context"
	"testing"
	"time"
)

// TestFigures prints the JetStream consumer's figures (3 nodes,
// PostgreSQL, 32 partitions, batches of 32, 6 x 640 events published):
//
//	consumer.nats.events / .duplicates / .gaps / .out_of_order  (through a
//	    pause past the lease mid-batch, a crash and a graceful leave)
//	consumer.nats.paused_batches_refused  (the paused node's commits the
//	    fence refused)
func TestFigures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fc := runFaults(t, ctx, 32, 32, 640)
	if err := fc.report.Err(); err != nil {
		t.Error(err)
	}
	t.Logf("figure: consumer.nats.events %d", fc.report.Produced)
	t.Logf("figure: consumer.nats.applied %d", fc.report.Applied)
	t.Logf("figure: consumer.nats.duplicates %d", fc.report.Duplicates)
	t.Logf("figure: consumer.nats.gaps %d", fc.report.Gaps)
	t.Logf("figure: consumer.nats.out_of_order %d", fc.report.OutOfOrder)
	t.Logf("figure: consumer.nats.paused_batches_refused %d", fc.pausedStale)
}
