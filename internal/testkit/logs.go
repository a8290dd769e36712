package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// RecentLogs is a slog.Handler that keeps the last Max records at Info and
// above, for printing when a test fails. Handlers made by WithAttrs share
// its records.
type RecentLogs struct {
	mu   *sync.Mutex
	recs *[]string
	max  int
	with []slog.Attr
}

// NewRecentLogs returns a RecentLogs that keeps the last max records.
func NewRecentLogs(max int) *RecentLogs {
	return &RecentLogs{mu: &sync.Mutex{}, recs: &[]string{}, max: max}
}

// Max is how many records Dump returns at most.
func (h *RecentLogs) Max() int { return h.max }

// Enabled reports whether l is Info or above.
func (h *RecentLogs) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

// Handle keeps r, formatted on one line.
func (h *RecentLogs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %q", r.Time.Format("15:04:05.000"), r.Level, r.Message)
	for _, a := range h.with {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, b.String())
	if n := len(*h.recs); n > 2*h.max {
		*h.recs = append((*h.recs)[:0], (*h.recs)[n-h.max:]...)
	}
	return nil
}

// WithAttrs returns a handler that adds as to every record.
func (h *RecentLogs) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.with = append(append([]slog.Attr(nil), h.with...), as...)
	return &c
}

// WithGroup returns h: groups are not kept apart.
func (h *RecentLogs) WithGroup(string) slog.Handler { return h }

// Dump returns the last Max records, one a line.
func (h *RecentLogs) Dump() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := *h.recs
	if len(recs) > h.max {
		recs = recs[len(recs)-h.max:]
	}
	return strings.Join(recs, "\n")
}
