package worker_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/coordinator/worker/internal/consumertest"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// backend is a database engine the cluster tests run on.
type backend struct {
	name    string
	dialect sqlfence.Dialect
	open    func(t testing.TB) *sql.DB
	serial  string // an auto-increment primary key
}

func backends() []backend {
	return []backend{
		{"sqlite", sqlfence.SQLite(), func(t testing.TB) *sql.DB { return testdb.SQLite(t, "worker.db") }, "INTEGER PRIMARY KEY AUTOINCREMENT"},
		{"postgres", sqlfence.Postgres(), testdb.Postgres, "BIGSERIAL PRIMARY KEY"},
	}
}

// eventLog is a log of events in a table, consumed into an applied table
// (one row per application, deliberately without a unique key, so that a
// duplicate shows instead of failing) with the offsets under the fence.
type eventLog struct {
	db       *sql.DB
	fence    *sqlfence.Fence
	offsets  *sqlfence.Offsets
	batch    int
	parts    int
	produced []int64 // per partition: events appended so far
	unfenced bool    // commit without the fence (for the figures' baseline)
	mu       sync.Mutex
}

func newEventLog(t *testing.T, ctx context.Context, b backend, parts, batch, pool int) *eventLog {
	t.Helper()
	db := b.open(t)
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	f, err := sqlfence.New(db, b.dialect, sqlfence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	o, err := sqlfence.NewOffsets(b.dialect, sqlfence.OffsetsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE events (partition_id BIGINT NOT NULL, event_offset BIGINT NOT NULL, amount BIGINT NOT NULL, PRIMARY KEY (partition_id, event_offset))`,
		`CREATE TABLE applied (seq ` + b.serial + `, partition_id BIGINT NOT NULL, event_offset BIGINT NOT NULL, epoch BIGINT NOT NULL, owner TEXT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	return &eventLog{db: db, fence: f, offsets: o, batch: batch, parts: parts, produced: make([]int64, parts)}
}

// produce appends n events to every partition.
func (l *eventLog) produce(ctx context.Context, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for p := range l.parts {
		for range n {
			if _, err := tx.ExecContext(ctx, `INSERT INTO events (partition_id, event_offset, amount) VALUES ($1, $2, 1)`, p, l.produced[p]); err != nil {
				return err
			}
			l.produced[p]++
		}
	}
	return tx.Commit()
}

// process is the user's Func: read a batch from the committed offset,
// commit its applications and the new offset under the fence.
func (l *eventLog) process(h *consumertest.Hold) worker.Func {
	return func(ctx context.Context, lease *ownership.Lease) (int, error) {
		p := lease.Partition()
		from, err := l.offsets.Get(ctx, l.db, p)
		if err != nil {
			return 0, err
		}
		var n int64
		if err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM events WHERE partition_id = $1 AND event_offset >= $2 ORDER BY event_offset LIMIT $3) AS b`, p, from, l.batch).Scan(&n); err != nil || n == 0 {
			return 0, err
		}
		if h != nil {
			h.Wait()
		}
		tok := lease.Token()
		apply := func(tx sqlfence.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO applied (partition_id, event_offset, epoch, owner)
SELECT partition_id, event_offset, $4, $5 FROM events WHERE partition_id = $1 AND event_offset >= $2 AND event_offset < $3 ORDER BY event_offset`, p, from, from+n, int64(tok.Epoch), tok.Owner)
			return err
		}
		if l.unfenced {
			return int(n), l.commitUnfenced(ctx, p, from, from+n, apply)
		}
		return int(n), l.offsets.Commit(ctx, l.fence, tok, from, from+n, apply)
	}
}

// lag is how many events are not yet consumed.
func (l *eventLog) lag(ctx context.Context) (int64, error) {
	var n int64
	err := l.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM events e WHERE e.event_offset >=
COALESCE((SELECT o.next_offset FROM tenure_offsets o WHERE o.partition_id = e.partition_id), 0)`).Scan(&n)
	return n, err
}

func (l *eventLog) waitConsumed(ctx context.Context, t *testing.T) {
	t.Helper()
	tenuretest.WaitFor(ctx, t, "every event consumed", func() bool {
		n, err := l.lag(ctx)
		return err == nil && n == 0
	})
}

// check runs worker.Check on the database.
func (l *eventLog) check(ctx context.Context, t *testing.T) worker.Report {
	t.Helper()
	produced, err := worker.Query(ctx, l.db, `SELECT partition_id, event_offset FROM events ORDER BY partition_id, event_offset`)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := worker.Query(ctx, l.db, `SELECT partition_id, event_offset FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	return worker.Check(produced, applied)
}

// startConsumers starts nodes consumers of l, each a Runtime of cfg
// processing l, its batches waiting at the node's Hold.
func startConsumers(t *testing.T, ctx context.Context, l *eventLog, nodes int, cfg worker.Config) *consumertest.Consumers {
	t.Helper()
	return consumertest.Start(t, ctx, tenuretest.Config{Nodes: nodes, Partitions: l.parts, Fence: l.fence}, func(h *consumertest.Hold) (*worker.Runtime, error) {
		c := cfg
		c.Process = l.process(h)
		return worker.New(c)
	})
}

// commitUnfenced is Offsets.Commit without the fence: the baseline.
func (l *eventLog) commitUnfenced(ctx context.Context, p uint32, from, next int64, fn func(sqlfence.Tx) error) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := l.offsets.Advance(ctx, tx, p, from, next); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
