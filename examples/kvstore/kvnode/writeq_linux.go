package kvnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// crossQueue is a ticket queue shared by the processes that open the same
// file, built from open-file-description byte-range locks (F_OFD_SETLK),
// which the kernel drops when their process dies, however it dies.
//
// Bytes 0-7 hold the next ticket. A writer locks them, reads its ticket t,
// locks the byte at slotBase+t (its slot), writes t+1 and unlocks: so a
// slot is locked from the moment its ticket is drawn. It then waits until
// it can lock slot t-1, which its predecessor holds until its turn ends
// (or it dies), and lets go of it at once. Its own turn ends when it
// unlocks slot t. Linux wakes lock waiters in no particular order, but
// each slot has one waiter, its successor, so the order is the tickets'.
type crossQueue struct {
	self *os.File // holds this process's slots
	wait *os.File // waits on the predecessors' slots
	bg   sync.WaitGroup
}

// slotBase is the offset of ticket 0's slot.
const slotBase = 1 << 20

func openCrossQueue(path string) (*crossQueue, error) {
	self, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kvnode: SQLite write queue: %w", err)
	}
	// A second open file description: its locks conflict with self's.
	wait, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		self.Close()
		return nil, fmt.Errorf("kvnode: SQLite write queue: %w", err)
	}
	return &crossQueue{self: self, wait: wait}, nil
}

// acquire waits for this process's turn; one call at a time (the
// process's fifo). If the writer ahead holds its place for longer than
// patience, acquire returns anyway: the caller then meets SQLite's busy
// handler, still holding its own place, so the writers behind it wait
// for it. If ctx ends first, acquire returns ctx's error and its place is
// given up only once the writer ahead is done, so the order holds. If
// the queue file fails, acquire returns without a turn.
func (q *crossQueue) acquire(ctx context.Context) (func(), error) {
	t, ok := q.ticket()
	if !ok {
		return func() {}, nil
	}
	release := func() { _ = lock(q.self, unix.F_UNLCK, slotBase+t, false) }
	if t == 0 || lock(q.wait, unix.F_WRLCK, slotBase+t-1, false) == nil {
		if t > 0 {
			_ = lock(q.wait, unix.F_UNLCK, slotBase+t-1, false)
		}
		return release, nil
	}
	// Wait in a goroutine of its own, since a lock wait can't be
	// cancelled. When the caller stops waiting, it says whether the wait
	// is to give the place up (ctx ended) or keep it (patience ran out).
	ready, leave := make(chan struct{}), make(chan bool, 1)
	q.bg.Add(1)
	go func() {
		defer q.bg.Done()
		if lock(q.wait, unix.F_WRLCK, slotBase+t-1, true) == nil {
			_ = lock(q.wait, unix.F_UNLCK, slotBase+t-1, false)
		}
		select {
		case ready <- struct{}{}:
		case giveUp := <-leave:
			if giveUp {
				release()
			}
		}
	}()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case <-ready:
		return release, nil
	case <-timer.C:
		leave <- false
		return release, nil
	case <-ctx.Done():
		leave <- true
		return nil, ctx.Err()
	}
}

// ticket draws the next ticket and locks its slot. ok is false if the
// file failed, or its counter stayed locked past patience (its holder
// stopped).
func (q *crossQueue) ticket() (t int64, ok bool) {
	deadline := time.Now().Add(patience)
	for lock(q.self, unix.F_WRLCK, 0, false) != nil {
		if time.Now().After(deadline) {
			return 0, false
		}
		time.Sleep(50 * time.Microsecond)
	}
	defer lock(q.self, unix.F_UNLCK, 0, false)
	var b [8]byte
	if _, err := q.self.ReadAt(b[:], 0); err != nil && !errors.Is(err, io.EOF) {
		return 0, false
	}
	t = int64(binary.LittleEndian.Uint64(b[:]) % (1 << 60))
	if lock(q.self, unix.F_WRLCK, slotBase+t, false) != nil {
		return 0, false
	}
	binary.LittleEndian.PutUint64(b[:], uint64(t+1))
	if _, err := q.self.WriteAt(b[:], 0); err != nil {
		_ = lock(q.self, unix.F_UNLCK, slotBase+t, false)
		return 0, false
	}
	return t, true
}

// lock sets (F_WRLCK) or clears (F_UNLCK) an OFD lock on one byte of f at
// off (0: the counter, 8 bytes), waiting for it if wait.
func lock(f *os.File, typ int16, off int64, wait bool) error {
	l := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: off, Len: 1}
	if off == 0 {
		l.Len = 8
	}
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := unix.FcntlFlock(f.Fd(), cmd, &l)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// close closes the file, which ends this process's turns. It first waits
// (up to patience) for the waits that ctx ended to give their places up.
func (q *crossQueue) close() error {
	done := make(chan struct{})
	go func() { q.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(patience):
	}
	return errors.Join(q.self.Close(), q.wait.Close())
}
