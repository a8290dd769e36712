package natssource

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
	"github.com/tenure-go/tenure/ring"
)

// Subject returns partition p's subject under prefix: "prefix.p". The
// stream's subjects must cover "prefix.*".
func Subject(prefix string, p uint32) string {
	return prefix + "." + strconv.FormatUint(uint64(p), 10)
}

// SubjectOf returns the subject a producer publishes key's event to: that
// of ring.PartitionString(key, partitions), the partition function the
// coordinator's ring uses (XXH64 of the key mod the partition count).
// partitions must be the coordinator's Config.Partitions.
func SubjectOf(prefix, key string, partitions int) string {
	return Subject(prefix, ring.PartitionString(key, partitions))
}

// ApplyFunc applies a batch of partition p's messages, in stream order,
// in tx, the fenced transaction that also moves p's offset past them. It
// must write through tx only, and may be called again for the same
// messages after a commit that did not happen (or whose outcome was
// unknown and did not land): nothing it wrote then was committed.
type ApplyFunc func(ctx context.Context, tx sqlfence.Tx, p uint32, msgs []jetstream.Msg) error

// Config configures a Source. Stream, DB, Fence, Offsets, Prefix and
// Apply are required; the zero value of the rest means its default.
type Config struct {
	// Stream is the JetStream stream holding the events; its subjects
	// cover Prefix+".*".
	Stream jetstream.Stream
	// Prefix is the subjects' prefix: partition p's events are on
	// Subject(Prefix, p).
	Prefix string
	// DB, Fence and Offsets are the database the events are applied to,
	// its fence (the coordinator's Config.Fence) and the offset table.
	DB      *sql.DB
	Fence   *sqlfence.Fence
	Offsets *sqlfence.Offsets
	// Apply applies a batch. Required.
	Apply ApplyFunc
	// Batch is the most messages a batch holds. Default 64.
	Batch int
	// RequestTimeout bounds creating a partition's consumer on the
	// server. A fetch does not wait for messages: it returns what the
	// stream has (the worker backs off on an empty batch), within about
	// a second. Default 5 s.
	RequestTimeout time.Duration
}

// Validate reports whether c is usable. It does not modify c.
func (c Config) Validate() error {
	switch {
	case c.Stream == nil || c.DB == nil || c.Fence == nil || c.Offsets == nil:
		return errors.New("natssource: Config.Stream, DB, Fence and Offsets are required")
	case c.Prefix == "":
		return errors.New("natssource: Config.Prefix is required")
	case c.Apply == nil:
		return errors.New("natssource: Config.Apply is required")
	case c.Batch < 0 || c.RequestTimeout < 0:
		return errors.New("natssource: Config.Batch and RequestTimeout must not be negative")
	}
	return nil
}

// Source reads each partition's subject from its committed offset and
// applies it under the fence: its Process is a worker.Func, its Stop a
// worker.Config.Stop. Its methods are safe for concurrent use.
type Source struct {
	cfg Config

	mu   sync.Mutex
	curs map[*ownership.Lease]*cursor
}

// cursor is a lease's JetStream consumer: an ephemeral pull consumer of
// the partition's subject, without acks, positioned at next.
type cursor struct {
	cons jetstream.Consumer
	next int64 // the offset the consumer delivers from; -1: unknown
	// delivered is the consumer sequence of the last message the Source
	// read from cons: the next must be delivered+1. A jump means the
	// server delivered messages the Source never saw (a fetch the client
	// ended, silently, after a second without a message, while they were
	// on their way): an ack-less consumer does not send them again.
	delivered uint64
}

// Batch is what Fetch read of a partition: its messages from offset
// From, in stream order.
type Batch struct {
	Partition uint32
	From      int64 // the committed offset the batch was read from
	Next      int64 // the offset after it: the last message's stream sequence + 1
	Msgs      []jetstream.Msg
}

// New returns a Source for cfg. It starts nothing.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Batch == 0 {
		cfg.Batch = 64
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	return &Source{cfg: cfg, curs: map[*ownership.Lease]*cursor{}}, nil
}

// Process is a worker.Func: Fetch, then Commit. It returns how many
// messages it applied.
func (s *Source) Process(ctx context.Context, lease *ownership.Lease) (int, error) {
	b, err := s.Fetch(ctx, lease)
	if err != nil || len(b.Msgs) == 0 {
		return 0, err
	}
	return len(b.Msgs), s.Commit(ctx, lease, b)
}

// Fetch reads the next batch of lease's partition, from its committed
// offset in the database: up to Config.Batch messages already in the
// stream, none if it has nothing new. The offset is the stream sequence
// of the first message not yet applied (0: from the start).
func (s *Source) Fetch(ctx context.Context, lease *ownership.Lease) (Batch, error) {
	p := lease.Partition()
	from, err := s.cfg.Offsets.Get(ctx, s.cfg.DB, p)
	if err != nil {
		return Batch{}, err
	}
	c, err := s.cursor(ctx, lease, from)
	if err != nil {
		return Batch{}, err
	}
	c.next = -1 // until this fetch is known to have read what it returns
	res, err := c.cons.FetchNoWait(s.cfg.Batch)
	if err != nil {
		return Batch{}, fmt.Errorf("natssource: fetch p%d: %w", p, err)
	}
	b := Batch{Partition: p, From: from, Next: from}
	for m := range res.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return Batch{}, fmt.Errorf("natssource: fetch p%d: %w", p, err)
		}
		if md.Sequence.Consumer != c.delivered+1 {
			// Deliveries were lost: c.next stays -1, so the next Fetch
			// reads from the committed offset on a new consumer.
			return Batch{}, fmt.Errorf("natssource: fetch p%d: delivery %d after %d: messages lost on the way; reading again from %d", p, md.Sequence.Consumer, c.delivered, from)
		}
		c.delivered++
		b.Msgs = append(b.Msgs, m)
		b.Next = int64(md.Sequence.Stream) + 1
	}
	if err := res.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return Batch{}, fmt.Errorf("natssource: fetch p%d: %w", p, err)
	}
	c.next = b.Next
	return b, nil
}

// Commit applies b and moves the partition's offset from b.From to
// b.Next in one fenced transaction under lease's token
// (sqlfence.Offsets.Commit), and returns its error unchanged: a stale
// token, an unknown outcome, or sqlfence.ErrOffsetMoved (the batch was
// applied before; nothing was applied now). After any error the next
// Fetch reads from the committed offset again.
func (s *Source) Commit(ctx context.Context, lease *ownership.Lease, b Batch) error {
	err := s.cfg.Offsets.Commit(ctx, s.cfg.Fence, lease.Token(), b.From, b.Next, func(tx sqlfence.Tx) error {
		return s.cfg.Apply(ctx, tx, b.Partition, b.Msgs)
	})
	if err != nil {
		s.mu.Lock()
		if c := s.curs[lease]; c != nil {
			c.next = -1
		}
		s.mu.Unlock()
	}
	return err
}

// Stop deletes lease's consumer from the server: set it as
// worker.Config.Stop (or call it from yours). It waits at most 2 s; a
// consumer it could not delete goes when the server sees it idle for a
// minute.
func (s *Source) Stop(lease *ownership.Lease, _ error) {
	s.mu.Lock()
	c := s.curs[lease]
	delete(s.curs, lease)
	s.mu.Unlock()
	if c != nil {
		s.deleteConsumer(c.cons)
	}
}

func (s *Source) deleteConsumer(cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.cfg.Stream.DeleteConsumer(ctx, cons.CachedInfo().Name)
}

// cursor returns lease's consumer positioned at from, creating it (or
// replacing one elsewhere) if needed.
func (s *Source) cursor(ctx context.Context, lease *ownership.Lease, from int64) (*cursor, error) {
	s.mu.Lock()
	c := s.curs[lease]
	s.mu.Unlock()
	if c != nil && c.next == from {
		return c, nil
	}
	if c != nil {
		s.deleteConsumer(c.cons)
	}
	cfg := jetstream.ConsumerConfig{
		FilterSubject:     Subject(s.cfg.Prefix, lease.Partition()),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       uint64(max(from, 1)),
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	cons, err := s.cfg.Stream.CreateConsumer(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("natssource: consumer of p%d at %d: %w", lease.Partition(), from, err)
	}
	c = &cursor{cons: cons, next: from}
	s.mu.Lock()
	s.curs[lease] = c
	s.mu.Unlock()
	return c, nil
}
