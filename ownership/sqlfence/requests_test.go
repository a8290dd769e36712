package sqlfence_test

import (
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// newRequests returns a request table of its own on db, created.
func newRequests(t *testing.T, db *sql.DB, d sqlfence.Dialect, now func() time.Time) *sqlfence.Requests {
	t.Helper()
	r, _ := newRequestsTable(t, db, d, now)
	return r
}

// newRequestsTable is newRequests that also returns the table's name.
func newRequestsTable(t *testing.T, db *sql.DB, d sqlfence.Dialect, now func() time.Time) (*sqlfence.Requests, string) {
	t.Helper()
	table := uniqueName(t, db, "tenure_requests")
	r, err := sqlfence.NewRequests(d, sqlfence.RequestsConfig{Table: table, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Ctx(t, 60*time.Second)
	if err := r.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	return r, table
}

// A write with a request id applies once: a duplicate gets the first
// result and does not run; a write that failed records nothing, and its
// retry runs; the same id in another partition is another write; and a
// duplicate sent to the next owner finds the old owner's record.
func TestRequestsOnce(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
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
			e1 := fencetest.Tok(1, 1, "a", 1)
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
			// A caller that commits despite fn's error leaves no record.
			if err := f.Do(ctx, e1, ownership.Exact, func(tx *sql.Tx) error {
				_, _, err := reqs.Once(ctx, tx, 1, "r4", func() ([]byte, error) { return nil, boom })
				if !errors.Is(err, boom) {
					return fmt.Errorf("Once = %v, want boom", err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got, dup, err := write(e1, "r4", "after a swallowed error", nil); err != nil || dup || got != "after a swallowed error" {
				t.Fatalf("retry after a committed failure: %q %v %v", got, dup, err)
			}
			if _, dup, err := write(e1, "", "no id", nil); err != nil || dup {
				t.Fatalf("no id: %v %v", dup, err)
			}
			e2 := fencetest.Tok(2, 1, "a", 1)
			if _, err := f.Fence(ctx, e2); err != nil {
				t.Fatal(err)
			}
			if _, dup, err := write(e2, "r1", "other partition", nil); err != nil || dup {
				t.Fatalf("same id, other partition: %v %v", dup, err)
			}
			// The partition moves: the new owner sees the old one's record,
			// and the old one's retry is refused by the fence.
			e1b := fencetest.Tok(1, 2, "b", 1)
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

// Duplicates racing on one partition apply once, in both modes: the
// request id is locked before it is looked up, so a duplicate waits for
// the first write's transaction and gets its result.
func TestRequestsConcurrentDuplicates(t *testing.T) {
	for _, b := range backends() {
		for _, conc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/concurrent=%v", b.name, conc), func(t *testing.T) {
				t.Parallel()
				ctx := testkit.Ctx(t, 60*time.Second)
				db := b.open(t)
				f, _ := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: conc})
				reqs := newRequests(t, db, b.dialect, nil)
				e1 := fencetest.Tok(1, 1, "a", 1)
				mustFence(t, f, e1)
				var runs, dups atomic.Int64
				results := make(chan string, 8)
				var wg sync.WaitGroup
				errs := make(chan error, 8)
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs <- f.Do(ctx, e1, ownership.Exact, func(tx *sql.Tx) error {
							res, dup, err := reqs.Once(ctx, tx, 1, "same", func() ([]byte, error) {
								runs.Add(1)
								return []byte(fmt.Sprint(i)), nil
							})
							if dup {
								dups.Add(1)
							}
							results <- string(res)
							return err
						})
					}()
				}
				wg.Wait()
				close(errs)
				close(results)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				if runs.Load() != 1 || dups.Load() != 7 {
					t.Fatalf("%d runs, %d duplicates; want 1 and 7", runs.Load(), dups.Load())
				}
				first := ""
				for r := range results {
					if first == "" {
						first = r
					}
					if r != first {
						t.Fatalf("duplicates got results %q and %q; want the first for all", first, r)
					}
				}
			})
		}
	}
}

// TestRequestsDuplicateWaitsForTheFirst: on PostgreSQL, a duplicate that
// arrives while the first write of its request id is still in its
// transaction waits for it and gets its result, in both modes, and a
// fence arriving meanwhile waits for both. With
// Config.Concurrent the two transactions share the partition's row, and
// the duplicate used to look the id up, find nothing, run fn a second time
// and fail on the record's unique key: a plain error for a write that had
// applied.
func TestRequestsDuplicateWaitsForTheFirst(t *testing.T) {
	b := backends()[1]
	for _, conc := range []bool{false, true} {
		t.Run(fmt.Sprintf("concurrent=%v", conc), func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			db := b.open(t)
			f, fenceTable := newFenceTable(t, db, b.dialect, sqlfence.Config{Concurrent: conc})
			reqs, reqTable := newRequestsTable(t, db, b.dialect, nil)
			e1 := fencetest.Tok(1, 1, "a", 1)
			mustFence(t, f, e1)
			var runs atomic.Int64
			started := make(chan struct{})
			write := func(name string, during func()) <-chan string {
				out := make(chan string, 1)
				go func() {
					var res []byte
					var dup bool
					err := f.Do(ctx, e1, ownership.Exact, func(tx *sql.Tx) error {
						var err error
						res, dup, err = reqs.Once(ctx, tx, 1, "same", func() ([]byte, error) {
							runs.Add(1)
							during()
							return []byte(name), nil
						})
						return err
					})
					out <- fmt.Sprintf("%s dup=%v err=%v", res, dup, err)
				}()
				return out
			}
			// The first write holds its transaction open until the second
			// runs fn too (the defect) or waits for a lock of either table.
			release := make(chan struct{})
			unblock := sync.OnceFunc(func() { close(release) })
			t.Cleanup(unblock) // if the test fails first
			first := write("first", func() {
				close(started)
				<-release
			})
			<-started
			second := write("second", func() {})
			testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the duplicate waiting or running", func() bool {
				return runs.Load() > 1 || lockWaiters(t, db, reqTable, "", "") > 0 || lockWaiters(t, db, fenceTable, "", "") > 0
			})
			// A fence that arrives now queues behind both and does not
			// deadlock with them: the id is claimed after the partition's
			// locks, and waited for only by holders of the same ones.
			fenced := fenceAsync(ctx, f, fencetest.Tok(1, 2, "b", 1))
			testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the duplicate and the fence waiting", func() bool {
				return runs.Load() > 1 || lockWaiters(t, db, reqTable, "", "")+lockWaiters(t, db, fenceTable, "", "") >= 2
			})
			unblock()
			if err := <-fenced; err != nil {
				t.Errorf("fence: %v", err)
			}
			if got, want := <-first, "first dup=false err=<nil>"; got != want {
				t.Errorf("first write: %s, want %s", got, want)
			}
			if got, want := <-second, "first dup=true err=<nil>"; got != want {
				t.Errorf("duplicate: %s, want %s", got, want)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("fn ran %d times, want once", n)
			}
		})
	}
}

func TestRequestsForget(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	b := backends()[0]
	db := b.open(t)
	f := newFence(t, db, b.dialect)
	now := time.Unix(1000, 0)
	reqs := newRequests(t, db, b.dialect, func() time.Time { return now })
	e1 := fencetest.Tok(1, 1, "a", 1)
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
