package ring

import "sync/atomic"

// Holder holds the current Table and swaps it atomically: readers Load the
// Table and use it without locks while a writer Stores its successor. The zero
// Holder is ready to use and holds nil (an empty Table). A Holder must not be
// copied after first use.
type Holder struct {
	p atomic.Pointer[Table]
}

// Load returns the current Table, nil if none was stored.
func (h *Holder) Load() *Table { return h.p.Load() }

// Store makes t the current Table.
func (h *Holder) Store(t *Table) { h.p.Store(t) }

// Swap makes t the current Table and returns the previous one.
func (h *Holder) Swap(t *Table) *Table { return h.p.Swap(t) }

// CompareAndSwap makes new the current Table only if old is, and reports
// whether it did.
func (h *Holder) CompareAndSwap(old, new *Table) bool { return h.p.CompareAndSwap(old, new) }
