package sqlfence_test

import (
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// newRequests returns a request table of its own on db, created.
func newRequests(t *testing.T, db *sql.DB, d sqlfence.Dialect, now func() time.Time) *sqlfence.Requests {
	t.Helper()
	r, err := sqlfence.NewRequests(d, sqlfence.RequestsConfig{Table: uniqueName(t, db, "tenure_requests"), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testContext(t)
	defer cancel()
	if err := r.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	return r
}

// A write with a request id applies once: a duplicate gets the first
// result and does not run; a write that failed records nothing, and its
// retry runs; the same id in another partition is another write; and a
// duplicate sent to the next owner finds the old owner's record.
func TestRequestsOnce(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := testContext(t)
			defer cancel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			reqs := newRequests(t, db, b.dialect, nil)
			var runs atomic.Int64
			write := func(tok ownership.Token, id string, result string, fail error) (string, bool, error) {
				var got []byte
				var dup bool
				err := f.Do(ctx, tok, ownership.Exact, func(tx *sql.Tx) error {
					var err error
					got, dup, err = reqs.Once(ctx, tx, tok.Partition, id, func() ([]byte, error) {
						runs.Add(1)
						return []byte(result), fail
					})
					return err
				})
				return string(got), dup, err
			}
			e1 := tok(1, 1, "a", 1)
			if _, err := f.Fence(ctx, e1); err != nil {
				t.Fatal(err)
			}
			if got, dup, err := write(e1, "r1", "first", nil); err != nil || dup || got != "first" {
				t.Fatalf("first write: %q %v %v", got, dup, err)
			}
			if got, dup, err := write(e1, "r1", "second", nil); err != nil || !dup || got != "first" || runs.Load() != 1 {
				t.Fatalf("duplicate: %q %v %v after %d runs; want the first result, not run", got, dup, err, runs.Load())
			}
			boom := errors.New("boom")
			if _, _, err := write(e1, "r2", "x", boom); !errors.Is(err, boom) {
				t.Fatalf("failed write: %v", err)
			}
			if got, dup, err := write(e1, "r2", "retried", nil); err != nil || dup || got != "retried" {
				t.Fatalf("retry of a failed write: %q %v %v", got, dup, err)
			}
			if _, dup, err := write(e1, "", "no id", nil); err != nil || dup {
				t.Fatalf("no id: %v %v", dup, err)
			}
			e2 := tok(2, 1, "a", 1)
			if _, err := f.Fence(ctx, e2); err != nil {
				t.Fatal(err)
			}
			if _, dup, err := write(e2, "r1", "other partition", nil); err != nil || dup {
				t.Fatalf("same id, other partition: %v %v", dup, err)
			}
			// The partition moves: the new owner sees the old one's record,
			// and the old one's retry is refused by the fence.
			e1b := tok(1, 2, "b", 1)
			if _, err := f.Fence(ctx, e1b); err != nil {
				t.Fatal(err)
			}
			if got, dup, err := write(e1b, "r1", "again", nil); err != nil || !dup || got != "first" {
				t.Fatalf("duplicate at the new owner: %q %v %v", got, dup, err)
			}
			if _, _, err := write(e1, "r3", "stale", nil); !errors.Is(err, ownership.ErrStaleToken) {
				t.Fatalf("old owner: %v", err)
			}
		})
	}
}

// Duplicates racing on one partition apply once: the fence's row lock runs
// them one at a time.
func TestRequestsConcurrentDuplicates(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := testContext(t)
			defer cancel()
			db := b.open(t)
			f := newFence(t, db, b.dialect)
			reqs := newRequests(t, db, b.dialect, nil)
			e1 := tok(1, 1, "a", 1)
			if _, err := f.Fence(ctx, e1); err != nil {
				t.Fatal(err)
			}
			var runs, dups atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- f.Do(ctx, e1, ownership.Exact, func(tx *sql.Tx) error {
						_, dup, err := reqs.Once(ctx, tx, 1, "same", func() ([]byte, error) {
							runs.Add(1)
							return []byte(fmt.Sprint(i)), nil
						})
						if dup {
							dups.Add(1)
						}
						return err
					})
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if runs.Load() != 1 || dups.Load() != 7 {
				t.Fatalf("%d runs, %d duplicates; want 1 and 7", runs.Load(), dups.Load())
			}
		})
	}
}

func TestRequestsForget(t *testing.T) {
	ctx, cancel := testContext(t)
	defer cancel()
	b := backends()[0]
	db := b.open(t)
	f := newFence(t, db, b.dialect)
	now := time.Unix(1000, 0)
	reqs := newRequests(t, db, b.dialect, func() time.Time { return now })
	e1 := tok(1, 1, "a", 1)
	if _, err := f.Fence(ctx, e1); err != nil {
		t.Fatal(err)
	}
	for i, at := range []time.Time{time.Unix(1000, 0), time.Unix(2000, 0)} {
		now = at
		if err := f.Do(ctx, e1, ownership.Exact, func(tx *sql.Tx) error {
			_, _, err := reqs.Once(ctx, tx, 1, fmt.Sprint("r", i), func() ([]byte, error) { return nil, nil })
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := reqs.Forget(ctx, db, time.Unix(1500, 0)); err != nil || n != 1 {
		t.Fatalf("Forget = %d, %v; want 1", n, err)
	}
	if _, err := sqlfence.NewRequests(sqlfence.Dialect{}, sqlfence.RequestsConfig{}); err == nil {
		t.Fatal("a zero dialect is accepted")
	}
	if _, err := sqlfence.NewRequests(b.dialect, sqlfence.RequestsConfig{Table: "a;b"}); err == nil {
		t.Fatal("a bad table name is accepted")
	}
}
