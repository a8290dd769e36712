package kvnode

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenure-go/tenure/internal/testkit"
)

// TestWriteQueueWaiterGivesUpItsPlace: a writer whose context ends while
// it waits for its turn returns the context's error, and its place is
// given up once the writer ahead is done, so the writer behind it gets
// its turn. Three queues on one file stand for three processes.
func TestWriteQueueWaiterGivesUpItsPlace(t *testing.T) {
	ctx := testkit.Ctx(t, time.Minute)
	path := filepath.Join(t.TempDir(), "kv.db")
	var qs [3]*writeQueue
	for i := range qs {
		q, err := newWriteQueue(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		qs[i] = q
	}
	first, err := qs[0].acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := qs[1].acquire(cctx)
		gaveUp <- err
	}()
	waitQueued(ctx, t, path, 2)
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("a writer whose context ended got a turn while the writer ahead held it")
	}
	got := make(chan error, 1)
	go func() {
		release, err := qs[2].acquire(ctx)
		if err == nil {
			release()
		}
		got <- err
	}()
	waitQueued(ctx, t, path, 3)
	first()
	if err := <-got; err != nil {
		t.Fatalf("the writer behind the one that gave up: %v", err)
	}
	// The place given up is free: nobody holds the second ticket's slot.
	f, err := os.OpenFile(path+"-queue", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := lock(f, unix.F_WRLCK, slotBase+1, false); err != nil {
		t.Fatalf("the place of the writer that gave up is still held: %v", err)
	}
	// The local FIFO is free again in each queue.
	for i, q := range qs {
		release, err := q.acquire(ctx)
		if err != nil {
			t.Fatalf("queue %d after the turns: %v", i, err)
		}
		release()
	}
}

// TestWriteQueuePassesAStalledWriter: a writer ahead that keeps its turn
// (a process stopped mid-turn) holds the one behind it for patience, not
// for ever: the queue goes on to SQLite's busy handler, which decides.
func TestWriteQueuePassesAStalledWriter(t *testing.T) {
	ctx := testkit.Ctx(t, 10*time.Second)
	path := filepath.Join(t.TempDir(), "kv.db")
	stalled, err := newWriteQueue(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stalled.Close() })
	next, err := newWriteQueue(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { next.Close() })
	held, err := stalled.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held()
	release, err := next.acquire(ctx)
	if err != nil {
		t.Fatalf("the writer behind a stalled one: %v", err)
	}
	release()
}

// waitQueued waits until n tickets of the queue at path were drawn.
func waitQueued(ctx context.Context, t *testing.T, path string, n byte) {
	t.Helper()
	testkit.WaitFor(ctx, t, "the tickets to be drawn", func() bool {
		b, err := readFirst(path + "-queue")
		return err == nil && b >= n
	})
}

func readFirst(path string) (byte, error) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return 0, err
	}
	return b[0], nil
}
