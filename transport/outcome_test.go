package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

func TestOutcomeUnknown(t *testing.T) {
	err := OutcomeUnknown("h:1", "connection lost")
	if !errors.Is(err, ownership.ErrOutcomeUnknown) || errors.Is(err, context.Canceled) || status.Code(err) != codes.Unknown {
		t.Fatalf("%v: Is(ErrOutcomeUnknown) %v, code %v", err, errors.Is(err, ownership.ErrOutcomeUnknown), status.Code(err))
	}
	// Across a hop: only the status survives, and is recognised.
	remote := status.Convert(err).Err()
	ou, ok := AsOutcomeUnknown(remote)
	if !ok || ou.Addr != "h:1" || ou.Reason != "connection lost" || !IsOutcomeUnknown(remote) {
		t.Fatalf("after a hop: %+v %v", ou, ok)
	}
	// Wrapped by the caller, still itself.
	if ou, ok := AsOutcomeUnknown(fmt.Errorf("put: %w", err)); !ok || ou.Addr != "h:1" {
		t.Fatalf("wrapped: %+v %v", ou, ok)
	}
	// A fence's unknown commit becomes the status, even wrapping a lease end.
	st := StatusFromError(fmt.Errorf("commit: %w (%w)", ownership.ErrOutcomeUnknown, ownership.ErrLeaseEnded))
	if !IsOutcomeUnknown(st) || status.Code(st) != codes.Unknown {
		t.Fatalf("StatusFromError(unknown commit) = %v", st)
	}
	// Negative controls: other errors are not unknown outcomes.
	for _, e := range []error{nil, errors.New("x"), status.Error(codes.Unknown, "plain"), HandoffStatus(3, "n"),
		status.Error(codes.DeadlineExceeded, "deadline")} {
		if IsOutcomeUnknown(e) {
			t.Errorf("%v taken for an unknown outcome", e)
		}
	}
}

func TestRequestID(t *testing.T) {
	id := NewRequestID()
	if len(id) != 32 || id == NewRequestID() {
		t.Fatalf("NewRequestID = %q", id)
	}
	ctx, err := WithRequestID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := RequestIDFromOutgoing(ctx); err != nil || got != id {
		t.Fatalf("outgoing id %q %v", got, err)
	}
	if _, err := WithRequestID(ctx, "another"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a second id: %v", err)
	}
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs(RequestIDMetadata, id))
	if got, err := RequestIDFromIncoming(in); err != nil || got != id {
		t.Fatalf("incoming id %q %v", got, err)
	}
	if got, err := RequestIDFromIncoming(context.Background()); err != nil || got != "" {
		t.Fatalf("no id: %q %v", got, err)
	}
	for name, md := range map[string]metadata.MD{
		"repeated":  metadata.Pairs(RequestIDMetadata, "a", RequestIDMetadata, "b"),
		"empty":     metadata.Pairs(RequestIDMetadata, ""),
		"space":     metadata.Pairs(RequestIDMetadata, "a b"),
		"oversized": metadata.Pairs(RequestIDMetadata, strings.Repeat("a", MaxRequestIDSize+1)),
	} {
		if _, err := RequestIDFromIncoming(metadata.NewIncomingContext(context.Background(), md)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Request ids come from the network: any input is accepted or refused
// with InvalidArgument, and an accepted id is what was sent.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "a", "order-17", "a b", "\x00", strings.Repeat("x", 129), "é"} {
		f.Add(s, uint8(1))
	}
	f.Fuzz(func(t *testing.T, s string, n uint8) {
		md := fuzzMD(RequestIDMetadata, s, n)
		got, err := RequestIDFromIncoming(metadata.NewIncomingContext(context.Background(), md))
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		vals := md.Get(RequestIDMetadata)
		if len(vals) == 0 {
			if got != "" {
				t.Fatalf("id %q from no value", got)
			}
			return
		}
		if len(vals) != 1 || got != vals[0] || len(got) > MaxRequestIDSize || got == "" {
			t.Fatalf("accepted %q from %q", got, vals)
		}
	})
}

// An unknown outcome's detail comes from the network: any detail decodes
// without a panic, to bounded fields.
func FuzzAsOutcomeUnknown(f *testing.F) {
	f.Add("h:1", "lost", ReasonOutcomeUnknown, uint32(codes.Unknown))
	f.Add(strings.Repeat("a", 600), strings.Repeat("r", 2000), ReasonOutcomeUnknown, uint32(codes.Unknown))
	f.Add("", "", ReasonHandoff, uint32(codes.Unavailable))
	f.Fuzz(func(t *testing.T, addr, reason, r string, code uint32) {
		if !utf8.ValidString(addr) || !utf8.ValidString(reason) || !utf8.ValidString(r) {
			return // proto strings on the wire are UTF-8
		}
		err := withInfo(codes.Code(code%17), "x", errorInfo(r, map[string]string{"address": addr, "reason": reason}))
		ou, ok := AsOutcomeUnknown(err)
		if !ok {
			return
		}
		if r != ReasonOutcomeUnknown || codes.Code(code%17) != codes.Unknown {
			t.Fatalf("decoded a %q detail with code %d", r, code%17)
		}
		if len(ou.Addr) > maxHintAddr || len(ou.Reason) > maxReason {
			t.Fatalf("unbounded fields: %d, %d bytes", len(ou.Addr), len(ou.Reason))
		}
	})
}
