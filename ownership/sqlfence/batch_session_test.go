package sqlfence_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ownership/fencetest"
	"github.com/tenure-go/tenure/ownership/sqlfence"
)

// A batch whose session the server ends before its commit (a paused
// owner's session, ended while a new owner fenced) is refused whole:
// every write, the one whose statement found the session gone included,
// gets an error wrapping ErrSessionEnded and the stale token, and nothing
// is applied. Without savepoints the write that found the session gone
// got its driver's error alone, as if it had failed on its own (a
// constraint it broke), so a router would not retry it at the next owner.
func TestBatcherSessionEndedRefusesTheBatch(t *testing.T) {
	be := backends()[1]
	for _, iso := range isolations {
		t.Run(iso.name, func(t *testing.T) {
			ctx := testkit.Ctx(t, 60*time.Second)
			r := newBatchRig(t, be, sqlfence.BatchConfig{Savepoints: iso.savepoints})
			old, next := fencetest.Tok(1, 1, "a", 1), fencetest.Tok(1, 2, "b", 1)
			fenced(t, r.f, old)
			release, first := r.hold(t, ctx, old, 0)
			a := r.async(ctx, old, "", r.insert(1))
			r.queued(t, 1, 1)
			killer := r.async(ctx, old, "", func(ctx context.Context, tx sqlfence.Tx) ([]byte, error) {
				pid := backendPID(t, ctx, tx)
				if _, err := r.db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					return nil, fmt.Errorf("terminate: %w", err)
				}
				waitGone(t, ctx, r.db, pid)
				fenced(t, r.f, next) // the lock went with the session
				return r.insert(2)(ctx, tx)
			})
			r.queued(t, 1, 2)
			c := r.async(ctx, old, "", r.insert(3))
			r.queued(t, 1, 3)
			release()
			if o := get(t, first); o.err != nil {
				t.Fatal(o.err)
			}
			for i, ch := range []<-chan outcome{a, killer, c} {
				o := get(t, ch)
				if !errors.Is(o.err, sqlfence.ErrSessionEnded) || errors.Is(o.err, ownership.ErrOutcomeUnknown) {
					t.Errorf("write %d of a batch whose session ended: %v; want ErrSessionEnded", i, o.err)
					continue
				}
				fencetest.WantStale(t, o.err, next)
			}
			if got := fmt.Sprint(r.rows(t)); got != "[0]" {
				t.Fatalf("rows %s; want [0]", got)
			}
			if infos := r.infos(); len(infos) != 2 || !errors.Is(infos[1].Err, sqlfence.ErrSessionEnded) {
				t.Fatalf("batches %+v; want the holder's, then one that failed with ErrSessionEnded", infos)
			}
		})
	}
}

// The zero BatchConfig holds the defaults its doc states: a partition's
// queue takes 1024 writes (the next one waits for room, here until its
// context ends: ErrQueueFull), and a batch carries at most 32.
func TestBatcherZeroConfigDefaults(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	r := newBatchRig(t, backends()[0], sqlfence.BatchConfig{})
	tk := fencetest.Tok(1, 1, "a", 1)
	fenced(t, r.f, tk)
	release, first := r.hold(t, ctx, tk, 0)
	const queueLen, maxWrites = 1024, 32
	chs := make([]<-chan outcome, queueLen)
	for i := range chs {
		chs[i] = r.async(ctx, tk, "", r.insert(i+1))
	}
	r.queued(t, 1, queueLen)
	short, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer scancel()
	if _, _, err := r.b.Do(short, tk, "", r.insert(-1)); !errors.Is(err, sqlfence.ErrQueueFull) {
		t.Fatalf("write %d to the queue: %v; want ErrQueueFull", queueLen+1, err)
	}
	release()
	for _, ch := range append(chs, first) {
		if o := get(t, ch); o.err != nil {
			t.Fatal(o.err)
		}
	}
	infos := r.infos()
	if len(infos) != 1+queueLen/maxWrites {
		t.Fatalf("%d batches; want the holder's and %d of %d", len(infos), queueLen/maxWrites, maxWrites)
	}
	for _, i := range infos[1:] {
		if i.Writes != maxWrites {
			t.Fatalf("a batch of %d writes; want %d", i.Writes, maxWrites)
		}
	}
}

// A partition's flusher ends once its queue has stayed empty for MaxWait,
// without Close: a partition that moved away, or that is written once,
// leaves no goroutine behind. Not parallel, so that no other test's
// flushers run meanwhile.
func TestBatcherIdleFlushersEnd(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	r := newBatchRig(t, backends()[0], sqlfence.BatchConfig{MaxWait: time.Millisecond})
	const partitions = 20
	for p := range uint32(partitions) {
		tk := fencetest.Tok(p, 1, "a", 1)
		fenced(t, r.f, tk)
		if _, _, err := r.b.Do(ctx, tk, "", r.insert(int(p))); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.infos()); n != partitions {
		t.Fatalf("%d batches; want %d", n, partitions)
	}
	testkit.WaitFor(testkit.Ctx(t, 20*time.Second), t, "the idle partitions' flushers to end", func() bool { return flushers() == 0 })
}

// flushers counts the goroutines running a Batcher's flusher.
func flushers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "sqlfence.(*Batcher).flush(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A Batcher not made by NewBatcher refuses writes with an error and its
// Close, Cancel and Queued do nothing; none panics. (Before, Do panicked
// on a nil map and Close on a nil channel.)
func TestZeroBatcher(t *testing.T) {
	ctx := testkit.Ctx(t, 60*time.Second)
	var b sqlfence.Batcher
	tk := fencetest.Tok(1, 1, "a", 1)
	noPanic := func(what string, f func()) {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s on a zero Batcher panicked: %v", what, r)
			}
		}()
		f()
	}
	noPanic("Cancel", func() { b.Cancel(tk) })
	noPanic("Queued", func() {
		if n := b.Queued(1); n != 0 {
			t.Errorf("Queued = %d", n)
		}
	})
	noPanic("Close", func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	// Last: a panic in Do would leave the Batcher's mutex held.
	noPanic("Do", func() {
		_, _, err := b.Do(ctx, tk, "", func(context.Context, sqlfence.Tx) ([]byte, error) {
			t.Error("a zero Batcher ran a write")
			return nil, nil
		})
		if err == nil {
			t.Error("a zero Batcher accepted a write")
		}
	})
}
