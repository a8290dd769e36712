package coordinator

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
)

// handlerCalls records which goroutines are running a Handler call, so
// that Close and Leave, called from one of them, do not wait for the call
// they are part of (it would wait for itself). Go has no goroutine-local
// state; the goroutine's id (runtime.Stack's header) stands for it. It is
// read only around handler calls and in Close and Leave, never on a hot
// path.
type handlerCalls struct {
	mu  sync.Mutex
	ids map[uint64]int // goroutine id -> handler calls running on it
}

// run runs fn, a Handler call, marking the calling goroutine as in one.
func (h *handlerCalls) run(fn func()) {
	id := goid()
	if id == 0 {
		fn() // unreadable: Close and Leave wait as from any goroutine
		return
	}
	h.mu.Lock()
	if h.ids == nil {
		h.ids = make(map[uint64]int)
	}
	h.ids[id]++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		if h.ids[id]--; h.ids[id] == 0 {
			delete(h.ids, id)
		}
		h.mu.Unlock()
	}()
	fn()
}

// inCall reports whether the calling goroutine is running a Handler call.
func (h *handlerCalls) inCall() bool {
	id := goid()
	if id == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ids[id] > 0
}

// goid returns the calling goroutine's id, from the first line of its
// stack trace ("goroutine 42 [running]:"), or 0 if it can't be read.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b, ok := bytes.CutPrefix(b, []byte("goroutine "))
	if !ok {
		return 0
	}
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0
	}
	return id
}
