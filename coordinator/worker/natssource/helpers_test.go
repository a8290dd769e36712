package natssource_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/coordinator/worker"
	"github.com/tenure-go/tenure/coordinator/worker/internal/consumertest"
	"github.com/tenure-go/tenure/coordinator/worker/natssource"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// defaultNATS is the local test server, used when TENURE_NATS_URL is
// unset (.ci/nats starts it with JetStream).
const defaultNATS = "nats://127.0.0.1:4222"

// connect connects to the NATS test server, closed when the test ends,
// and fails the test if it is unreachable or has no JetStream.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := os.Getenv("TENURE_NATS_URL")
	if url == "" {
		url = defaultNATS
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		t.Fatalf("NATS at %s is unreachable; the test needs a server with JetStream (.ci/nats): %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("NATS at %s has no JetStream (start it with -js): %v", url, err)
	}
	return nc, js
}

// newStream creates a stream of the test's own, deleted when it ends,
// and returns it with its subjects' prefix.
func newStream(t testing.TB, js jetstream.JetStream) (jetstream.Stream, string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "TENURE_TEST_" + strings.ToUpper(hex.EncodeToString(b[:]))
	prefix := "tenure.test." + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".*"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return s, prefix
}

// broker is a stream of events consumed into PostgreSQL: an applied
// table with one row per application (deliberately without a unique key,
// so that a duplicate shows instead of failing), offsets under the fence.
type broker struct {
	js       jetstream.JetStream
	stream   jetstream.Stream
	prefix   string
	parts    int
	db       *sql.DB
	fence    *sqlfence.Fence
	offsets  *sqlfence.Offsets
	mu       sync.Mutex
	produced []worker.Record // in publish order: per partition, stream order
	keys     int
}

func newBroker(t *testing.T, ctx context.Context, parts, pool int) *broker {
	t.Helper()
	_, js := connect(t)
	s, prefix := newStream(t, js)
	db := testdb.Postgres(t)
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool) // a worker per partition: see sqlfence's caller's duties
	f, err := sqlfence.New(db, sqlfence.Postgres(), sqlfence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	o, err := sqlfence.NewOffsets(sqlfence.Postgres(), sqlfence.OffsetsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE applied (seq BIGSERIAL PRIMARY KEY, partition_id BIGINT NOT NULL, stream_seq BIGINT NOT NULL, key TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := f.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	return &broker{js: js, stream: s, prefix: prefix, parts: parts, db: db, fence: f, offsets: o}
}

// produce publishes n events, each to the subject of its key's partition.
func (b *broker) produce(ctx context.Context, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		key := fmt.Sprintf("key-%d", b.keys)
		b.keys++
		subj := natssource.SubjectOf(b.prefix, key, b.parts)
		ack, err := b.js.Publish(ctx, subj, []byte(key))
		if err != nil {
			return err
		}
		var p uint32
		if _, err := fmt.Sscanf(strings.TrimPrefix(subj, b.prefix+"."), "%d", &p); err != nil {
			return err
		}
		b.produced = append(b.produced, worker.Record{Partition: p, ID: fmt.Sprint(ack.Sequence)})
	}
	return nil
}

// apply is the user's ApplyFunc: one row per message, in one statement.
func apply(ctx context.Context, tx sqlfence.Tx, p uint32, msgs []jetstream.Msg) error {
	var (
		q    strings.Builder
		args []any
	)
	q.WriteString(`INSERT INTO applied (partition_id, stream_seq, key) VALUES `)
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if i > 0 {
			q.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&q, "($%d, $%d, $%d)", n+1, n+2, n+3)
		args = append(args, int64(p), int64(md.Sequence.Stream), string(m.Data()))
	}
	_, err := tx.ExecContext(ctx, q.String(), args...)
	return err
}

// ends returns, per partition, the offset past its last produced event.
func (b *broker) ends() map[uint32]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	end := map[uint32]int64{}
	for _, r := range b.produced {
		var s int64
		fmt.Sscan(r.ID, &s)
		end[r.Partition] = s + 1
	}
	return end
}

func (b *broker) waitConsumed(ctx context.Context, t *testing.T) {
	t.Helper()
	end := b.ends()
	tenuretest.WaitFor(ctx, t, "every event consumed", func() bool {
		for p, e := range end {
			o, err := b.offsets.Get(ctx, b.db, p)
			if err != nil || o < e {
				return false
			}
		}
		return true
	})
}

// check runs worker.Check on what was published and the database.
func (b *broker) check(ctx context.Context, t *testing.T) worker.Report {
	t.Helper()
	applied, err := worker.Query(ctx, b.db, `SELECT partition_id, stream_seq FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return worker.Check(b.produced, applied)
}

// startConsumers starts nodes consumers of b, each a Runtime on a Source
// of the broker, its batches waiting at the node's Hold.
func startConsumers(t *testing.T, ctx context.Context, b *broker, nodes, batch int) *consumertest.Consumers {
	t.Helper()
	return consumertest.Start(t, ctx, tenuretest.Config{Nodes: nodes, Partitions: b.parts, Fence: b.fence}, func(h *consumertest.Hold) (*worker.Runtime, error) {
		return newRuntime(b, batch, h)
	})
}

// newRuntime is a node's consumer: a Source whose batches wait at h
// between the fetch and the commit.
func newRuntime(b *broker, batch int, h *consumertest.Hold) (*worker.Runtime, error) {
	src, err := natssource.New(natssource.Config{
		Stream: b.stream, Prefix: b.prefix, DB: b.db, Fence: b.fence, Offsets: b.offsets, Batch: batch,
		Apply: apply,
	})
	if err != nil {
		return nil, err
	}
	return worker.New(worker.Config{
		MaxConcurrent:   8,
		PollInterval:    10 * time.Millisecond,
		MaxPollInterval: 100 * time.Millisecond,
		Stop:            src.Stop,
		Process: func(ctx context.Context, lease *ownership.Lease) (int, error) {
			bt, err := src.Fetch(ctx, lease)
			if err != nil || len(bt.Msgs) == 0 {
				return 0, err
			}
			h.Wait()
			return len(bt.Msgs), src.Commit(ctx, lease, bt)
		},
	})
}
