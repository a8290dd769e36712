package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/slowtest"
)

// logRecord is one captured log line: its level, message and attributes
// (the logger's own, such as "node", first).
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r logRecord) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.level, r.msg)
	for k, v := range r.attrs {
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String()
}

// logCapture is a slog.Handler that keeps every record, at every level, for
// tests that assert what a coordinator logs.
type logCapture struct {
	mu   *sync.Mutex
	recs *[]logRecord
	with []slog.Attr
}

func newLogCapture() *logCapture {
	return &logCapture{mu: &sync.Mutex{}, recs: &[]logRecord{}}
}

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.with {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.with = append(append([]slog.Attr(nil), h.with...), as...)
	return &c
}

func (h *logCapture) WithGroup(string) slog.Handler { return h }

// records returns the records kept so far that pass keep.
func (h *logCapture) records(keep func(logRecord) bool) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.recs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// atLeast keeps the records at level l or above.
func atLeast(l slog.Level) func(logRecord) bool {
	return func(r logRecord) bool { return r.level >= l }
}

// Issue 11, defect 13: a normal start logged about 19 WARN lines (claims
// lost to expected races). A 5-node cluster that starts, converges and
// closes logs nothing at WARN or above.
func TestNormalStartLogsNoWarnings(t *testing.T) {
	t.Parallel()
	ctx, cancel := slowtest.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	logs := newLogCapture()
	tc := newTestCluster(t, func(c *Config) { c.Logger = slog.New(logs) })
	tc.startNodes(ctx, "w", 5)
	for _, n := range tc.all() {
		n.c.Close()
	}
	if len(logs.records(func(r logRecord) bool { return r.msg == "started" })) != 5 {
		t.Fatal("the capture missed the coordinators' own logs")
	}
	for _, r := range logs.records(atLeast(slog.LevelWarn)) {
		// Under a heavy load (the whole suite on two cores) a joining node
		// may adopt the grown stable membership before its view holds the
		// new members, and lack a quorum for StepDown: its leases end, and
		// that warning is due. Every other warning is an expected race.
		if strings.HasPrefix(r.msg, "no quorum for StepDown") {
			t.Logf("a node lacked a quorum for StepDown while the cluster started: %v", r)
			continue
		}
		t.Errorf("a normal start logged: %v", r)
	}
}
