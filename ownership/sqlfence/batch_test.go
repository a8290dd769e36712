package sqlfence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// batchRig is a fence, a data table (id BIGINT PRIMARY KEY) and a batcher
// whose batches it records.
type batchRig struct {
	db    *sql.DB
	mysql bool // "?" parameters
	f     *sqlfence.Fence
	b     *sqlfence.Batcher
	table string

	mu      sync.Mutex
	batches []sqlfence.BatchInfo
}

func newBatchRig(t *testing.T, be backend, cfg sqlfence.BatchConfig) *batchRig {
	t.Helper()
	db := be.open(t)
	return newBatchRigOn(t, db, be, cfg)
}

func newBatchRigOn(t *testing.T, db *sql.DB, be backend, cfg sqlfence.BatchConfig) *batchRig {
	t.Helper()
	ctx := testkit.Ctx(t, 60*time.Second)
	r := &batchRig{db: db, mysql: be.dialect.String() == "mysql", f: newFence(t, db, be.dialect), table: uniqueName(t, db, "data")}
	if _, err := db.ExecContext(ctx, `CREATE TABLE "`+r.table+`" (id BIGINT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	cfg.Observe = func(i sqlfence.BatchInfo) {
		r.mu.Lock()
		r.batches = append(r.batches, i)
		r.mu.Unlock()
	}
	b, err := sqlfence.NewBatcher(r.f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r.b = b
	return r
}

// insert is a write of row id.
func (r *batchRig) insert(id int) func(context.Context, sqlfence.Tx) ([]byte, error) {
	return func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
		_, err := tx.ExecContext(ctx, r.bind(`INSERT INTO "`+r.table+`" (id) VALUES ($1)`), id)
		return []byte(fmt.Sprint(id)), err
	}
}

// bind makes query's $1 a ? on MySQL.
func (r *batchRig) bind(query string) string {
	if r.mysql {
		return strings.ReplaceAll(query, "$1", "?")
	}
	return query
}

// rows returns the ids in the data table, in order.
func (r *batchRig) rows(t *testing.T) []int {
	t.Helper()
	ctx := testkit.Ctx(t, 60*time.Second)
	rs, err := r.db.QueryContext(ctx, `SELECT id FROM "`+r.table+`" ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var ids []int
	for rs.Next() {
		var id int
		if err := rs.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (r *batchRig) infos() []sqlfence.BatchInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sqlfence.BatchInfo(nil), r.batches...)
}

// outcome is what one Do returned.
type outcome struct {
	result []byte
	dup    bool
	err    error
}

// async runs Do in the background; the channel gets its outcome.
func (r *batchRig) async(ctx context.Context, tk ownership.Token, id string, fn func(context.Context, sqlfence.Tx) ([]byte, error)) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, dup, err := r.b.Do(ctx, tk, id, fn)
		ch <- outcome{res, dup, err}
	}()
	return ch
}

// hold sends a write under tk whose fn waits until release is closed, and
// returns once its batch is committing: the writes queued next form the
// next batch, together.
func (r *batchRig) hold(t *testing.T, ctx context.Context, tk ownership.Token, id int) (release func(), done <-chan outcome) {
	t.Helper()
	started, rel := make(chan struct{}), make(chan struct{})
	done = r.async(ctx, tk, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
		close(started)
		select {
		case <-rel:
		case <-ctx.Done():
		}
		return r.insert(id)(ctx, tx)
	})
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the holding write never ran")
	}
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(release)
	return release, done
}

// queued waits until n writes of partition p are queued.
func (r *batchRig) queued(t *testing.T, p uint32, n int) {
	t.Helper()
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, fmt.Sprintf("%d writes queued", n), func() bool { return r.b.Queued(p) == n })
}

func get(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(30 * time.Second):
		t.Fatal("no outcome after 30 s")
		return outcome{}
	}
}

func fenced(t *testing.T, f *sqlfence.Fence, tk ownership.Token) {
	t.Helper()
	ctx := testkit.Ctx(t, 60*time.Second)
	if _, err := f.Fence(ctx, tk); err != nil {
		t.Fatal(err)
	}
}

// isolations are the two ways a batch keeps a write's error its own.
var isolations = []struct {
	name       string
	savepoints bool
}{{"rerun", false}, {"savepoints", true}}

// Many writers of one partition: every write is applied once, the
// batcher groups them (a batch of more than one write, none above
// MaxWrites), and the batches' writes add up to the writes.
func TestBatcherAppliesEveryWrite(t *testing.T) {
	for _, be := range withMariaDB() {
		for _, iso := range isolations {
			t.Run(be.name+"/"+iso.name, func(t *testing.T) {
				t.Parallel()
				ctx := testkit.Ctx(t, 60*time.Second)
				r := newBatchRig(t, be, sqlfence.BatchConfig{MaxWrites: 8, Savepoints: iso.savepoints})
				tk := fencetest.Tok(3, 1, "a", 1)
				fenced(t, r.f, tk)
				const writers, each = 12, 10
				var wg sync.WaitGroup
				errs := make(chan error, writers*each)
				for w := range writers {
					wg.Go(func() {
						for i := range each {
							if _, _, err := r.b.Do(ctx, tk, "", r.insert(w*each+i)); err != nil {
								errs <- err
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if got := len(r.rows(t)); got != writers*each {
					t.Fatalf("%d rows; want %d", got, writers*each)
				}
				total, most := 0, 0
				for _, i := range r.infos() {
					total += i.Writes
					most = max(most, i.Writes)
					if i.Err != nil || i.Partition != 3 {
						t.Fatalf("batch %+v", i)
					}
				}
				if total != writers*each || most < 2 || most > 8 {
					t.Fatalf("batches carried %d writes, at most %d in one; want %d, between 2 and 8", total, most, writers*each)
				}
			})
		}
	}
}

// A write whose statement fails (a duplicate key) gets its own error and
// leaves nothing; its neighbours in the same batch are applied. Without
// savepoints the batch runs a second time without it.
func TestBatcherWriteErrorFailsOnlyItself(t *testing.T) {
	for _, be := range withMariaDB() {
		for _, iso := range isolations {
			t.Run(be.name+"/"+iso.name, func(t *testing.T) {
				t.Parallel()
				ctx := testkit.Ctx(t, 60*time.Second)
				r := newBatchRig(t, be, sqlfence.BatchConfig{Savepoints: iso.savepoints})
				tk := fencetest.Tok(1, 1, "a", 1)
				fenced(t, r.f, tk)
				release, first := r.hold(t, ctx, tk, 0)
				a := r.async(ctx, tk, "", r.insert(1))
				r.queued(t, 1, 1)
				bad := r.async(ctx, tk, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
					// A row, then a duplicate: both statements go.
					if _, err := r.insert(2)(ctx, tx); err != nil {
						return nil, err
					}
					return r.insert(1)(ctx, tx)
				})
				r.queued(t, 1, 2)
				c := r.async(ctx, tk, "", r.insert(3))
				r.queued(t, 1, 3)
				release()
				if o := get(t, first); o.err != nil {
					t.Fatal(o.err)
				}
				if o := get(t, a); o.err != nil || string(o.result) != "1" {
					t.Fatalf("write before the failing one: %q, %v", o.result, o.err)
				}
				if o := get(t, bad); o.err == nil || errors.Is(o.err, ownership.ErrOutcomeUnknown) || errors.Is(o.err, ownership.ErrStaleToken) {
					t.Fatalf("failing write: %v; want its own error", o.err)
				}
				if o := get(t, c); o.err != nil || string(o.result) != "3" {
					t.Fatalf("write after the failing one: %q, %v", o.result, o.err)
				}
				if got := fmt.Sprint(r.rows(t)); got != "[0 1 3]" {
					t.Fatalf("rows %s; want [0 1 3]", got)
				}
				infos := r.infos()
				if len(infos) != 2 || infos[1].Writes != 3 {
					t.Fatalf("batches %+v; want the holder, then the three together", infos)
				}
				if want := map[bool]int{false: 2, true: 1}[iso.savepoints]; infos[1].Runs != want {
					t.Fatalf("the batch ran %d times; want %d", infos[1].Runs, want)
				}
			})
		}
	}
}

// A batch under a token that is not the mark is refused whole: every
// write gets the stale-token error and none is applied. Writes under
// another token queued between a batch's writes are not carried in it.
func TestBatcherRefusesStaleBatches(t *testing.T) {
	for _, be := range withMariaDB() {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			r := newBatchRig(t, be, sqlfence.BatchConfig{})
			e1, e2 := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(1, 2, "b", 1)
			fenced(t, r.f, e2)
			// Under e2 (the mark) a batch is formed behind a holder; a
			// write under e1 queued in its middle must not ride in it.
			release, first := r.hold(t, ctx, e2, 0)
			w1 := r.async(ctx, e2, "", r.insert(1))
			r.queued(t, 1, 1)
			stale := r.async(ctx, e1, "", r.insert(2))
			r.queued(t, 1, 2)
			w3 := r.async(ctx, e2, "", r.insert(3))
			r.queued(t, 1, 3)
			release()
			for _, ch := range []<-chan outcome{first, w1, w3} {
				if o := get(t, ch); o.err != nil {
					t.Fatal(o.err)
				}
			}
			fencetest.WantStale(t, get(t, stale).err, e2)
			// A whole batch under e1.
			var chs []<-chan outcome
			release, first = r.hold(t, ctx, e2, 10)
			for i := range 4 {
				chs = append(chs, r.async(ctx, e1, "", r.insert(20+i)))
				r.queued(t, 1, i+1)
			}
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			for _, ch := range chs {
				fencetest.WantStale(t, get(t, ch).err, e2)
			}
			if got := fmt.Sprint(r.rows(t)); got != "[0 1 3 10]" {
				t.Fatalf("rows %s; want [0 1 3 10]", got)
			}
		})
	}
}

// A commit that fails after it was sent leaves every write of the batch
// in doubt: each gets ErrOutcomeUnknown, no context error. The commit here
// fails for sure (a deferred foreign key, broken by one write), but the
// batcher can't tell that from a commit whose answer was lost.
func TestBatcherCommitErrorIsOutcomeUnknownForAll(t *testing.T) {
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			db := be.open(t)
			if be.name == "sqlite" {
				var err error
				db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "fk.db")+
					"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			}
			r := newBatchRigOn(t, db, be, sqlfence.BatchConfig{})
			child := uniqueName(t, db, "child")
			if _, err := db.ExecContext(ctx, `CREATE TABLE "`+child+`" (id BIGINT REFERENCES "`+r.table+`" (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
				t.Fatal(err)
			}
			tk := fencetest.Tok(1, 1, "a", 1)
			fenced(t, r.f, tk)
			release, first := r.hold(t, ctx, tk, 0)
			var chs []<-chan outcome
			for i := range 3 {
				chs = append(chs, r.async(ctx, tk, "", r.insert(i+1)))
				r.queued(t, 1, i+1)
			}
			chs = append(chs, r.async(ctx, tk, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO "`+child+`" (id) VALUES (77)`) // no row 77
				return nil, err
			}))
			r.queued(t, 1, 4)
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			for i, ch := range chs {
				o := get(t, ch)
				if !errors.Is(o.err, ownership.ErrOutcomeUnknown) || errors.Is(o.err, context.Canceled) || errors.Is(o.err, context.DeadlineExceeded) {
					t.Fatalf("write %d of a batch whose commit failed: %v; want ErrOutcomeUnknown, no context error", i, o.err)
				}
			}
		})
	}
}

// Request ids keep a batch's writes exactly-once: a duplicate in the same
// batch, even after a re-run, and one in a later batch get the first
// write's result and don't run.
func TestBatcherRequestsExactlyOnce(t *testing.T) {
	for _, be := range withMariaDB() {
		for _, iso := range isolations {
			t.Run(be.name+"/"+iso.name, func(t *testing.T) {
				t.Parallel()
				ctx := testkit.Ctx(t, 60*time.Second)
				db := be.open(t)
				reqs := newRequests(t, db, be.dialect, nil)
				r := newBatchRigOn(t, db, be, sqlfence.BatchConfig{Requests: reqs, Savepoints: iso.savepoints})
				tk := fencetest.Tok(1, 1, "a", 1)
				fenced(t, r.f, tk)
				release, first := r.hold(t, ctx, tk, 0)
				type w struct {
					id  string
					row int
				}
				// The duplicate key (row 1 again, under id "c") fails on its
				// own and makes the re-run case run again.
				ws := []w{{"a", 1}, {"a", 2}, {"c", 1}, {"b", 3}, {"a", 4}}
				var chs []<-chan outcome
				for i, x := range ws {
					chs = append(chs, r.async(ctx, tk, x.id, r.insert(x.row)))
					r.queued(t, 1, i+1)
				}
				release()
				if o := get(t, first); o.err != nil {
					t.Fatal(o.err)
				}
				var got []string
				for _, ch := range chs {
					o := get(t, ch)
					got = append(got, fmt.Sprintf("%s/%v/%v", o.result, o.dup, o.err != nil))
				}
				if want := "[1/false/false 1/true/false /false/true 3/false/false 1/true/false]"; fmt.Sprint(got) != want {
					t.Fatalf("outcomes %v; want %s", got, want)
				}
				if o := get(t, r.async(ctx, tk, "b", r.insert(9))); !o.dup || string(o.result) != "3" || o.err != nil {
					t.Fatalf("duplicate in a later batch: %q, %v, %v", o.result, o.dup, o.err)
				}
				if got := fmt.Sprint(r.rows(t)); got != "[0 1 3]" {
					t.Fatalf("rows %s; want [0 1 3]", got)
				}
			})
		}
	}
}

// A lone write to an idle partition commits at once, even with a MaxWait
// of an hour; writes that find a batch committing (or one ended within
// MaxWait) wait for MaxWait (here: until Close, which fails them with
// nothing applied), unless MaxWrites of them are queued. Each case has a
// partition of its own: one that has just committed isn't idle.
func TestBatcherWhenBatchesGo(t *testing.T) {
	for _, be := range withMariaDB() {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			r := newBatchRig(t, be, sqlfence.BatchConfig{MaxWait: time.Hour, MaxWrites: 3})
			tk, tk3 := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(3, 1, "a", 1)
			for _, x := range []ownership.Token{tk, fencetest.Tok(2, 1, "a", 1), tk3} {
				fenced(t, r.f, x)
			}
			lone, lcancel := context.WithTimeout(ctx, 10*time.Second)
			defer lcancel()
			if _, _, err := r.b.Do(lone, fencetest.Tok(2, 1, "a", 1), "", r.insert(100)); err != nil {
				t.Fatalf("a lone write: %v; want it committed without waiting for MaxWait", err)
			}
			// MaxWrites queued: they go at once.
			release, first := r.hold(t, ctx, tk, 0)
			var chs []<-chan outcome
			for i := range 3 {
				chs = append(chs, r.async(ctx, tk, "", r.insert(i+1)))
				r.queued(t, 1, i+1)
			}
			release()
			for _, ch := range append(chs, first) {
				if o := get(t, ch); o.err != nil {
					t.Fatal(o.err)
				}
			}
			// Fewer: they wait.
			release, first = r.hold(t, ctx, tk3, 10)
			chs = chs[:0]
			for i := range 2 {
				chs = append(chs, r.async(ctx, tk3, "", r.insert(11+i)))
				r.queued(t, 3, i+1)
			}
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			select {
			case o := <-chs[0]:
				t.Fatalf("two writes below MaxWrites went before MaxWait: %v", o.err)
			case <-time.After(200 * time.Millisecond):
			}
			if err := r.b.Close(); err != nil {
				t.Fatal(err)
			}
			for _, ch := range chs {
				if o := get(t, ch); !errors.Is(o.err, sqlfence.ErrBatcherClosed) || !errors.Is(o.err, ownership.ErrLeaseEnded) {
					t.Fatalf("queued write at Close: %v; want ErrBatcherClosed", o.err)
				}
			}
			if _, _, err := r.b.Do(ctx, tk, "", r.insert(50)); !errors.Is(err, sqlfence.ErrBatcherClosed) {
				t.Fatalf("Do after Close: %v", err)
			}
			if got := fmt.Sprint(r.rows(t)); got != "[0 1 2 3 10 100]" {
				t.Fatalf("rows %s; want [0 1 2 3 10 100]", got)
			}
		})
	}
}

// A full queue pushes back: a write that finds no room waits, and fails
// with its context's error, nothing applied. Cancel fails the queued
// writes of a lease with ErrLeaseEnded; a caller whose context ends while
// its write is queued gets its context's error, and the write is not sent.
func TestBatcherPushesBackAndCancels(t *testing.T) {
	for _, be := range withMariaDB() {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := testkit.Ctx(t, 60*time.Second)
			r := newBatchRig(t, be, sqlfence.BatchConfig{QueueLen: 2, MaxWait: time.Hour})
			tk := fencetest.Tok(1, 1, "a", 1)
			fenced(t, r.f, tk)
			hctx, hcancel := context.WithCancel(ctx)
			release, first := r.hold(t, hctx, tk, 0)
			hcancel()
			a := r.async(ctx, tk, "", r.insert(1))
			r.queued(t, 1, 1)
			leaving, leave := context.WithCancel(ctx)
			b := r.async(leaving, tk, "", r.insert(2))
			r.queued(t, 1, 2)
			short, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer scancel()
			if _, _, err := r.b.Do(short, tk, "", r.insert(3)); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sqlfence.ErrQueueFull) {
				t.Fatalf("a write to a full queue: %v; want ErrQueueFull and its context's error", err)
			}
			leave()
			if o := get(t, b); !errors.Is(o.err, context.Canceled) || errors.Is(o.err, ownership.ErrOutcomeUnknown) {
				t.Fatalf("a queued write whose caller left: %v; want context.Canceled", o.err)
			}
			r.queued(t, 1, 1)
			r.b.Cancel(tk)
			// The holder's caller left while its batch was committing: it
			// still learns the batch's outcome (below: applied).
			if o := get(t, a); !errors.Is(o.err, ownership.ErrLeaseEnded) {
				t.Fatalf("a queued write of a cancelled lease: %v; want ErrLeaseEnded", o.err)
			}
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			if got := fmt.Sprint(r.rows(t)); got != "[0]" {
				t.Fatalf("rows %s; want [0]", got)
			}
		})
	}
}

// Bad input gets an error, not a panic.
func TestBatcherBadInput(t *testing.T) {
	db := openSQLite(t)
	f := newFence(t, db, sqlfence.SQLite())
	if _, err := sqlfence.NewBatcher(nil, sqlfence.BatchConfig{}); err == nil {
		t.Error("NewBatcher(nil) succeeded")
	}
	if _, err := sqlfence.NewBatcher(f, sqlfence.BatchConfig{MaxWrites: -1}); err == nil {
		t.Error("a negative MaxWrites accepted")
	}
	b, err := sqlfence.NewBatcher(f, sqlfence.BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testkit.Ctx(t, 60*time.Second)
	if _, _, err := b.Do(ctx, fencetest.Tok(1, 1, "a", 1), "", nil); err == nil {
		t.Error("a nil fn accepted")
	}
	if _, _, err := b.Do(ctx, fencetest.Tok(1, 1, "a", 1), "id", func(context.Context, sqlfence.Tx) ([]byte, error) { return nil, nil }); err == nil {
		t.Error("a request id without Requests accepted")
	}
	if _, _, err := b.Do(ctx, fencetest.Tok(1, 0, "a", 1), "", func(context.Context, sqlfence.Tx) ([]byte, error) { return nil, nil }); err == nil {
		t.Error("epoch 0 accepted")
	}
}
