package consumer

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// The store's contract on both engines: offsets are dense per partition, a
// batch reads from the committed offset, a commit under the fenced token
// applies and advances, a commit under an older token applies nothing,
// and Verify sees an event applied twice.
func TestStore(t *testing.T) {
	engines := []struct {
		name string
		open func(*testing.T) *sql.DB
		d    sqlfence.Dialect
	}{
		{"sqlite", openSQLite, sqlfence.SQLite()},
		{"postgres", openPostgres, sqlfence.Postgres()},
	}
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			ctx := testkit.Ctx(t, 30*time.Second)
			s := newStore(t, e.open(t), e.d)
			got, err := s.Append(ctx,
				Event{Partition: 1, Key: "a", Amount: 10},
				Event{Partition: 2, Key: "b", Amount: 1},
				Event{Partition: 1, Key: "b", Amount: 20},
				Event{Partition: 1, Key: "a", Amount: 30})
			if err != nil {
				t.Fatal(err)
			}
			if offs := [4]int64{got[0].Offset, got[1].Offset, got[2].Offset, got[3].Offset}; offs != [4]int64{0, 0, 1, 2} {
				t.Fatalf("offsets %v, want [0 0 1 2]", offs)
			}

			old, next := fencetest.Tok(1, 1, "x", 1), fencetest.Tok(1, 2, "y", 1)
			if _, err := s.Fence().Fence(ctx, old); err != nil {
				t.Fatal(err)
			}
			b, err := s.ReadBatch(ctx, old, 2)
			if err != nil || b.From != 0 || len(b.Events) != 2 || b.Next() != 2 {
				t.Fatalf("ReadBatch = %+v, %v; want offsets [0, 2)", b, err)
			}
			if err := s.Commit(ctx, b); err != nil {
				t.Fatalf("Commit under the mark: %v", err)
			}
			stale, err := s.ReadBatch(ctx, old, 2) // [2, 3), then y takes over
			if err != nil || stale.From != 2 || len(stale.Events) != 1 {
				t.Fatalf("ReadBatch = %+v, %v; want offsets [2, 3)", stale, err)
			}
			if _, err := s.Fence().Fence(ctx, next); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, stale); !errors.Is(err, ownership.ErrStaleToken) {
				t.Fatalf("Commit under a fenced-out token = %v, want ErrStaleToken", err)
			}
			if off, err := s.Offset(ctx, 1); err != nil || off != 2 {
				t.Fatalf("Offset after the rejected commit = %d, %v; want 2", off, err)
			}
			if lag, err := s.Lag(ctx); err != nil || lag != 2 {
				t.Fatalf("Lag = %d, %v; want 2", lag, err)
			}
			// The new owner carries on from the committed offset; another
			// takes partition 2.
			b, err = s.ReadBatch(ctx, next, 10)
			if err == nil {
				err = s.Commit(ctx, b)
			}
			p2 := fencetest.Tok(2, 1, "x", 1)
			if _, err := s.Fence().Fence(ctx, p2); err != nil {
				t.Fatal(err)
			}
			b2, err2 := s.ReadBatch(ctx, p2, 10)
			if err2 == nil {
				err2 = s.Commit(ctx, b2)
			}
			if err != nil || err2 != nil || b.From != 2 || len(b.Events) != 1 {
				t.Fatalf("new owner's batch %+v: %v, %v", b, err, err2)
			}
			r, err := s.Verify(ctx)
			if err != nil || r.Err() != nil || r.Events != 4 || r.Applications != 4 {
				t.Fatalf("Verify = %+v, %v (%v)", r, err, r.Err())
			}

			// The negative check: apply an event twice, skipping the fence.
			if err := unfencedCommit(s)(ctx, Batch{Token: old, From: 1, Events: []Event{got[2]}}); err != nil {
				t.Fatal(err)
			}
			r, err = s.Verify(ctx)
			if err != nil || r.DoubleApplied != 1 || r.BadBalances != 1 || r.BadOffsets != 1 || r.Err() == nil {
				t.Fatalf("after a double apply, Verify = %+v, %v; want 1 event applied twice, 1 bad balance, 1 bad offset", r, err)
			}
		})
	}
}

// NewStore refuses table prefixes that are not plain identifiers.
func TestNewStorePrefix(t *testing.T) {
	db := openSQLite(t)
	for _, p := range []string{"1x", "a-b", `a"b`, "a.b", "x_123456789_123456789_123456789_123456789"} {
		if _, err := NewStore(db, sqlfence.SQLite(), p); err == nil {
			t.Errorf("NewStore(%q) succeeded", p)
		}
	}
	for _, p := range []string{"", "c_", "Consumer2_"} {
		if s, err := NewStore(db, sqlfence.SQLite(), p); err != nil {
			t.Errorf("NewStore(%q): %v", p, err)
		} else {
			s.Close()
		}
	}
}

// unfencedCommit is Store.Commit without the fence and the offset's
// compare-and-set: the same writes in a plain transaction.
func unfencedCommit(s *Store) func(context.Context, Batch) error {
	return func(ctx context.Context, b Batch) error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := s.write(ctx, tx, b); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.q.offsetsTable+` SET next_offset = $2 WHERE partition_id = $1`, int64(b.Token.Partition), b.Next()); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// A commit whose outcome was unknown, and that did land, is not applied a
// second time by the batch read again before the commit was visible: the
// second commit, under the same token, finds the offset moved. (Before the
// offset was checked inside the fenced transaction, this applied the batch
// twice: reproduced on PostgreSQL, a balance wrong.)
func TestInDoubtCommitNotAppliedTwice(t *testing.T) {
	for _, e := range []struct {
		name string
		open func(*testing.T) *sql.DB
		d    sqlfence.Dialect
	}{{"sqlite", openSQLite, sqlfence.SQLite()}, {"postgres", openPostgres, sqlfence.Postgres()}} {
		t.Run(e.name, func(t *testing.T) {
			ctx := testkit.Ctx(t, 30*time.Second)
			s := newStore(t, e.open(t), e.d)
			if _, err := s.Append(ctx, Event{Partition: 1, Key: "a", Amount: 10}, Event{Partition: 1, Key: "a", Amount: 5}); err != nil {
				t.Fatal(err)
			}
			owner := fencetest.Tok(1, 1, "x", 1)
			if _, err := s.Fence().Fence(ctx, owner); err != nil {
				t.Fatal(err)
			}
			b, err := s.ReadBatch(ctx, owner, 10)
			if err != nil {
				t.Fatal(err)
			}
			// The commit lands, but its caller sees an error (the answer
			// was lost) and re-reads; the re-read raced the commit and got
			// the old offset: the same batch, under the same token.
			if err := s.Commit(ctx, b); err != nil {
				t.Fatal(err)
			}
			again := Batch{Token: owner, From: b.From, Events: b.Events}
			if err := s.Commit(ctx, again); !errors.Is(err, sqlfence.ErrOffsetMoved) {
				t.Fatalf("second commit of the batch = %v, want ErrOffsetMoved", err)
			}
			r, err := s.Verify(ctx)
			if err != nil || r.Err() != nil || r.DoubleApplied != 0 {
				t.Fatalf("Verify = %+v, %v (%v); want every event applied once", r, err, r.Err())
			}
		})
	}
}
