package consumer

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// DefaultPrefix is the table-name prefix when NewStore is given "".
const DefaultPrefix = "consumer_"

// ErrOffsetMoved is returned (wrapped) by Commit for a batch read from an
// offset that is no longer the partition's committed one: an earlier
// commit of the same events landed (one whose outcome was unknown, read
// again before it was visible), so this one is not applied. Read the next
// batch from the committed offset.
//
// Deprecated: it is sqlfence.ErrOffsetMoved, which the store's offsets
// (sqlfence.Offsets) return; test for that one.
var ErrOffsetMoved = sqlfence.ErrOffsetMoved

// Event is one entry of the log.
type Event struct {
	Partition uint32
	// Offset is the event's position in its partition: 0, 1, 2, ...
	// without gaps.
	Offset int64
	Key    string
	Amount int64
}

// Batch is a run of consecutive events of one partition, read by the
// holder of Token from the partition's committed offset.
type Batch struct {
	Token  ownership.Token
	From   int64   // the committed offset the batch was read from
	Events []Event // the events at From, From+1, ...
}

// Next is the offset to commit with the batch: the first event after it.
func (b Batch) Next() int64 { return b.From + int64(len(b.Events)) }

// Store is the database the consumers share. Its tables (each name starts
// with the prefix):
//
//	events    (partition_id, event_offset, key, amount)  the append-only log
//	offsets   (partition_id PRIMARY KEY, next_offset)    each partition's committed offset
//	                                                     (a sqlfence.Offsets table)
//	balances  (key PRIMARY KEY, total)                   the output: the sum of amounts per key
//	applied   (seq, partition_id, event_offset,          every application of an event, in commit
//	           epoch, owner)                             order, with the token that made it;
//	                                                     deliberately without a unique key, so that
//	                                                     an event applied twice shows up instead
//	                                                     of failing
//	fence                                                the sqlfence table (tokens per partition)
//
// The outputs and the offsets live in the same database as the fence, so
// one fenced transaction commits a batch's effect and its offset together,
// or neither.
//
// A Store is safe for concurrent use.
type Store struct {
	db      *sql.DB
	fence   *sqlfence.Fence
	offsets *sqlfence.Offsets
	q       queries
}

type queries struct {
	tables, schema                                      []string
	offsetsTable                                        string
	appendEvent, readEvents, addBalance, logApplied     string
	lag, allEvents, allApplied, allBalances, allOffsets string
}

// NewStore returns a store on db whose tables are named with prefix
// (letters, digits and underscores; "" means DefaultPrefix). It does not
// touch the database: call CreateSchema. The caller closes db after the
// Store.
func NewStore(db *sql.DB, d sqlfence.Dialect, prefix string) (*Store, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	offsets, err := sqlfence.NewOffsets(d, sqlfence.OffsetsConfig{Table: prefix + "offsets"})
	if err != nil {
		return nil, err
	}
	fence, err := sqlfence.New(db, d, sqlfence.Config{Table: prefix + "fence"})
	if err != nil {
		return nil, err
	}
	return &Store{db: db, fence: fence, offsets: offsets, q: newQueries(prefix, d)}, nil
}

func checkPrefix(p string) error {
	if len(p) > 40 {
		return fmt.Errorf("consumer: table prefix %q is longer than 40 bytes", p)
	}
	for i, c := range p {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9' || i == 0) {
			return fmt.Errorf("consumer: table prefix %q: want letters, digits and underscores, not starting with a digit", p)
		}
	}
	return nil
}

func newQueries(prefix string, d sqlfence.Dialect) queries {
	t := func(name string) string { return `"` + prefix + name + `"` }
	events, offsets, balances, applied := t("events"), t("offsets"), t("balances"), t("applied")
	serial := "BIGSERIAL PRIMARY KEY"
	if d.String() == "sqlite" {
		serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	return queries{
		tables:       []string{events, offsets, balances, applied, t("fence")},
		offsetsTable: offsets,
		schema: []string{
			`CREATE TABLE IF NOT EXISTS ` + events + ` (
	partition_id BIGINT NOT NULL,
	event_offset BIGINT NOT NULL,
	key TEXT NOT NULL,
	amount BIGINT NOT NULL,
	PRIMARY KEY (partition_id, event_offset))`,
			`CREATE TABLE IF NOT EXISTS ` + balances + ` (
	key TEXT NOT NULL PRIMARY KEY,
	total BIGINT NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + applied + ` (
	seq ` + serial + `,
	partition_id BIGINT NOT NULL,
	event_offset BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	owner TEXT NOT NULL)`,
		},
		// One statement that writes first, so that on SQLite it takes the
		// write lock before it reads the partition's last offset.
		appendEvent: `INSERT INTO ` + events + ` (partition_id, event_offset, key, amount)
SELECT $1, COALESCE(MAX(event_offset) + 1, 0), $2, $3 FROM ` + events + ` WHERE partition_id = $1
RETURNING event_offset`,
		readEvents: `SELECT event_offset, key, amount FROM ` + events + `
WHERE partition_id = $1 AND event_offset >= $2 ORDER BY event_offset LIMIT $3`,
		addBalance: `INSERT INTO ` + balances + ` AS b (key, total) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET total = b.total + excluded.total`,
		logApplied: `INSERT INTO ` + applied + ` (partition_id, event_offset, epoch, owner) VALUES ($1, $2, $3, $4)`,
		lag: `SELECT COUNT(*) FROM ` + events + ` e WHERE e.event_offset >=
COALESCE((SELECT o.next_offset FROM ` + offsets + ` o WHERE o.partition_id = e.partition_id), 0)`,
		allEvents:   `SELECT partition_id, event_offset, key, amount FROM ` + events + ` ORDER BY partition_id, event_offset`,
		allApplied:  `SELECT partition_id, event_offset FROM ` + applied + ` ORDER BY seq`,
		allBalances: `SELECT key, total FROM ` + balances,
		allOffsets:  `SELECT partition_id, next_offset FROM ` + offsets,
	}
}

// CreateSchema creates the store's tables, the fence's included, if they
// do not exist.
func (s *Store) CreateSchema(ctx context.Context) error {
	for _, stmt := range s.q.schema {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("consumer: create schema: %w", err)
		}
	}
	if err := s.offsets.CreateSchema(ctx, s.db); err != nil {
		return err
	}
	return s.fence.CreateSchema(ctx)
}

// DropSchema drops the store's tables, the fence's included.
func (s *Store) DropSchema(ctx context.Context) error {
	for _, t := range s.q.tables {
		if _, err := s.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return fmt.Errorf("consumer: drop %s: %w", t, err)
		}
	}
	return nil
}

// Fence returns the fence that guards the store's partitions: give it to
// the coordinator (coordinator.Config.Fence), which fences it with every
// new token before the node starts consuming.
func (s *Store) Fence() *sqlfence.Fence { return s.fence }

// Close releases the fence's prepared statements; the database stays open.
func (s *Store) Close() error { return s.fence.Close() }

// Append adds events to the log in one transaction, each at the end of its
// Partition (the producer sets Partition from the key, with the ring's
// Table.PartitionString), and returns them with their offsets. Appends to
// one partition must not run concurrently on PostgreSQL: the second one
// fails on the primary key and may be retried.
func (s *Store) Append(ctx context.Context, events ...Event) ([]Event, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("consumer: append: %w", err)
	}
	defer tx.Rollback() // a no-op after Commit
	out := make([]Event, len(events))
	for i, e := range events {
		if err := tx.QueryRowContext(ctx, s.q.appendEvent, int64(e.Partition), e.Key, e.Amount).Scan(&e.Offset); err != nil {
			return nil, fmt.Errorf("consumer: append to p%d: %w", e.Partition, err)
		}
		out[i] = e
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("consumer: append: %w", err)
	}
	return out, nil
}

// Offset returns partition p's committed offset: the first event not yet
// consumed.
func (s *Store) Offset(ctx context.Context, p uint32) (int64, error) {
	return s.offsets.Get(ctx, s.db, p)
}

// ReadBatch reads up to max events of the token's partition from its
// committed offset. It reads outside any transaction; Commit checks, inside
// its fenced transaction, that the committed offset is still the one the
// batch was read from, so neither a newer owner nor an earlier commit of
// this owner (one whose outcome was unknown) can make it apply events
// twice.
func (s *Store) ReadBatch(ctx context.Context, t ownership.Token, max int) (Batch, error) {
	from, err := s.Offset(ctx, t.Partition)
	if err != nil {
		return Batch{}, err
	}
	b := Batch{Token: t, From: from}
	rows, err := s.db.QueryContext(ctx, s.q.readEvents, int64(t.Partition), from, max)
	if err != nil {
		return Batch{}, fmt.Errorf("consumer: read p%d: %w", t.Partition, err)
	}
	defer rows.Close()
	for rows.Next() {
		e := Event{Partition: t.Partition}
		if err := rows.Scan(&e.Offset, &e.Key, &e.Amount); err != nil {
			return Batch{}, fmt.Errorf("consumer: read p%d: %w", t.Partition, err)
		}
		if e.Offset != b.Next() {
			break // not yet visible; never the case with one producer per partition
		}
		b.Events = append(b.Events, e)
	}
	if err := rows.Err(); err != nil {
		return Batch{}, fmt.Errorf("consumer: read p%d: %w", t.Partition, err)
	}
	return b, nil
}

// Commit applies b's events to the outputs and moves the partition's
// offset past them, in one transaction that commits only if b's token is
// still the partition's fencing token and the partition's committed
// offset is still b.From (sqlfence.Offsets.Commit). If a newer owner has
// fenced the partition it returns an error wrapping ownership.ErrStaleToken
// and nothing is applied: the newer owner consumes these events from the
// committed offset instead. If the offset moved (an earlier commit of these
// events landed, though its caller did not learn it) it returns an error
// wrapping sqlfence.ErrOffsetMoved and nothing is applied. An error
// wrapping ownership.ErrOutcomeUnknown means the commit may have landed:
// read the next batch from the committed offset (as ReadBatch does); its
// commit fails with sqlfence.ErrOffsetMoved if this one did land.
func (s *Store) Commit(ctx context.Context, b Batch) error {
	return s.offsets.Commit(ctx, s.fence, b.Token, b.From, b.Next(), func(tx sqlfence.Tx) error {
		return s.write(ctx, tx, b)
	})
}

// write writes b's effect in tx, unchecked; not its offset.
func (s *Store) write(ctx context.Context, tx sqlfence.Tx, b Batch) error {
	for _, e := range b.Events {
		if _, err := tx.ExecContext(ctx, s.q.addBalance, e.Key, e.Amount); err != nil {
			return fmt.Errorf("consumer: apply p%d@%d: %w", e.Partition, e.Offset, err)
		}
		if _, err := tx.ExecContext(ctx, s.q.logApplied, int64(e.Partition), e.Offset, int64(b.Token.Epoch), b.Token.Owner); err != nil {
			return fmt.Errorf("consumer: apply p%d@%d: %w", e.Partition, e.Offset, err)
		}
	}
	return nil
}

// Lag returns how many events of the log are not yet consumed, over all
// partitions.
func (s *Store) Lag(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q.lag).Scan(&n); err != nil {
		return 0, fmt.Errorf("consumer: lag: %w", err)
	}
	return n, nil
}
