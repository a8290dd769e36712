package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenure-go/tenure/internal/netdelay"
	"github.com/tenure-go/tenure/internal/testdb"
	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// offsetsFixture is a fence, an offset table and an effects table (one row
// per applied event) in one database.
type offsetsFixture struct {
	db      *sql.DB
	fence   *sqlfence.Fence
	offsets *sqlfence.Offsets
	effects string // the effects table's name, quoted
	table   string // the offset table's name
	fenceT  string // the fence table's name
}

func newOffsetsFixture(t *testing.T, ctx context.Context, b backend, db *sql.DB) *offsetsFixture {
	t.Helper()
	f, fenceT := newFenceTable(t, db, b.dialect, sqlfence.Config{})
	table := uniqueName(t, db, "tenure_offsets")
	o, err := sqlfence.NewOffsets(b.dialect, sqlfence.OffsetsConfig{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	effects := uniqueName(t, db, "tenure_effects")
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+effects+`" (partition_id BIGINT NOT NULL, event_offset BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &offsetsFixture{db: db, fence: f, offsets: o, effects: `"` + effects + `"`, table: table, fenceT: fenceT}
}

// apply returns the fn of a commit that records events [from, next) of p.
func (x *offsetsFixture) apply(ctx context.Context, p uint32, from, next int64) func(sqlfence.Tx) error {
	return func(tx sqlfence.Tx) error {
		for off := from; off < next; off++ {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+x.effects+` (partition_id, event_offset) VALUES ($1, $2)`, int64(p), off); err != nil {
				return err
			}
		}
		return nil
	}
}

// applications returns how many times each offset of p was applied.
func (x *offsetsFixture) applications(t *testing.T, ctx context.Context, p uint32) map[int64]int {
	t.Helper()
	rows, err := x.db.QueryContext(ctx, `SELECT event_offset FROM `+x.effects+` WHERE partition_id = $1`, int64(p))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := map[int64]int{}
	for rows.Next() {
		var off int64
		if err := rows.Scan(&off); err != nil {
			t.Fatal(err)
		}
		n[off]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func (x *offsetsFixture) wantOnce(t *testing.T, ctx context.Context, p uint32, next int64) {
	t.Helper()
	got := x.applications(t, ctx, p)
	for off := range next {
		if got[off] != 1 {
			t.Errorf("p%d@%d applied %d times, want once", p, off, got[off])
		}
	}
	if len(got) != int(next) {
		t.Errorf("p%d: %d offsets applied, want %d", p, len(got), next)
	}
	if cur, err := x.offsets.Get(ctx, x.db, p); err != nil || cur != next {
		t.Errorf("offset of p%d = %d, %v; want %d", p, cur, err, next)
	}
}

// TestOffsetsCommit: a commit moves the offset with its effects; a second
// commit of the same batch (read from the old offset) fails with an
// *OffsetMovedError and applies nothing; a former owner's commit is
// rejected and moves nothing.
func TestOffsetsCommit(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := testkit.Ctx(t, 60*time.Second)
			x := newOffsetsFixture(t, ctx, b, b.open(t))
			old, cur := fencetest.Tok(4, 1, "a", 1), fencetest.Tok(4, 2, "b", 1)
			if _, err := x.fence.Fence(ctx, old); err != nil {
				t.Fatal(err)
			}
			if from, err := x.offsets.Get(ctx, x.db, 4); err != nil || from != 0 {
				t.Fatalf("Get before any commit = %d, %v; want 0", from, err)
			}
			if err := x.offsets.Commit(ctx, x.fence, old, 0, 3, x.apply(ctx, 4, 0, 3)); err != nil {
				t.Fatalf("first commit: %v", err)
			}
			x.wantOnce(t, ctx, 4, 3)

			// The same batch again: the offset moved.
			err := x.offsets.Commit(ctx, x.fence, old, 0, 3, x.apply(ctx, 4, 0, 3))
			var moved *sqlfence.OffsetMovedError
			if !errors.As(err, &moved) || !errors.Is(err, sqlfence.ErrOffsetMoved) || moved.From != 0 || moved.Current != 3 {
				t.Fatalf("commit of a committed batch = %v, want an *OffsetMovedError from 0, current 3", err)
			}
			if err := x.offsets.Commit(ctx, x.fence, old, 2, 5, x.apply(ctx, 4, 2, 5)); !errors.Is(err, sqlfence.ErrOffsetMoved) {
				t.Fatalf("commit from a stale offset 2 = %v, want ErrOffsetMoved", err)
			}
			x.wantOnce(t, ctx, 4, 3)

			// A newer owner fences: the former owner's next batch is rejected.
			if _, err := x.fence.Fence(ctx, cur); err != nil {
				t.Fatal(err)
			}
			if err := x.offsets.Commit(ctx, x.fence, old, 3, 5, x.apply(ctx, 4, 3, 5)); !errors.Is(err, ownership.ErrStaleToken) {
				t.Fatalf("former owner's commit = %v, want a stale token error", err)
			}
			x.wantOnce(t, ctx, 4, 3)
			if err := x.offsets.Commit(ctx, x.fence, cur, 3, 5, x.apply(ctx, 4, 3, 5)); err != nil {
				t.Fatalf("new owner's commit: %v", err)
			}
			x.wantOnce(t, ctx, 4, 5)
			// Another partition starts at 0 on its own.
			if err := x.offsets.Commit(ctx, x.fence, fencetest.Tok(5, 1, "a", 1), 0, 1, nil); !errors.Is(err, ownership.ErrNotFenced) {
				t.Fatalf("commit on an unfenced partition = %v, want ErrNotFenced", err)
			}
			if err := x.offsets.Advance(ctx, x.db, 4, 5, 4); err == nil {
				t.Fatal("Advance backwards succeeded")
			}
		})
	}
}

// TestOffsetsInDoubtCommit: a commit whose answer is lost (the connection
// dies after the server committed, before its reply arrived) returns an
// error wrapping ownership.ErrOutcomeUnknown; the retry of the same batch
// fails with ErrOffsetMoved, and every event is applied once.
func TestOffsetsInDoubtCommit(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	b := backends()[1]
	direct := b.open(t)
	x := newOffsetsFixture(t, ctx, b, direct)
	token := fencetest.Tok(7, 1, "a", 1)
	if _, err := x.fence.Fence(ctx, token); err != nil {
		t.Fatal(err)
	}

	// A second handle on the same tables, through a proxy that delays
	// replies long enough to cut the connection after the commit landed.
	dsn, _ := testdb.PostgresDSN()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netdelay.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	host, port, _ := net.SplitHostPort(proxy.Addr())
	n, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(n), nil
	slow := stdlib.OpenDB(*cfg)
	defer slow.Close()
	slowFence, err := sqlfence.New(slow, b.dialect, sqlfence.Config{Table: x.fenceT})
	if err != nil {
		t.Fatal(err)
	}
	defer slowFence.Close()

	// Cut every proxied connection as soon as the commit is visible
	// directly: its reply is still in the proxy.
	cut := closeWhen(ctx, proxy, func() bool {
		cur, err := x.offsets.Get(ctx, direct, 7)
		return err == nil && cur == 4
	})
	err = x.offsets.Commit(ctx, slowFence, token, 0, 4, x.apply(ctx, 7, 0, 4))
	if perr := <-cut; perr != nil {
		t.Fatalf("the commit never landed: %v (Commit: %v)", perr, err)
	}
	if !errors.Is(err, ownership.ErrOutcomeUnknown) {
		t.Fatalf("commit with its answer lost = %v, want ErrOutcomeUnknown", err)
	}
	// The caller does not know: it retries the same batch.
	if err := x.offsets.Commit(ctx, x.fence, token, 0, 4, x.apply(ctx, 7, 0, 4)); !errors.Is(err, sqlfence.ErrOffsetMoved) {
		t.Fatalf("retry of an in-doubt commit = %v, want ErrOffsetMoved", err)
	}
	x.wantOnce(t, ctx, 7, 4)
}
