package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure/ownership"
)

func TestNotOwnerRoundTrip(t *testing.T) {
	for _, o := range []ownership.OwnerInfo{
		{Partition: 5, Node: "node-a", Addr: "10.0.0.1:7000", Token: testToken()},
		{Partition: 5, Node: "node-a", Addr: ""}, // handoff: no token yet
		{Partition: 0, Node: "n", Addr: "h:1", Token: ownership.Token{Partition: 0, Epoch: 1, Owner: "n"}},
	} {
		err := NotOwnerStatus(o)
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("code %v", status.Code(err))
		}
		got, ok := OwnerHint(err)
		if !ok || got != o {
			t.Fatalf("OwnerHint = %+v %v, want %+v", got, ok, o)
		}
		if IsHandoff(err) {
			t.Fatal("a not-owner status is a handoff")
		}
		if _, ok := StaleFromStatus(err); ok {
			t.Fatal("a not-owner status is stale")
		}
	}
	if _, ok := OwnerHint(errors.New("plain")); ok {
		t.Fatal("hint from a plain error")
	}
	if _, ok := OwnerHint(status.Error(codes.FailedPrecondition, "no detail")); ok {
		t.Fatal("hint from a status without detail")
	}
}

func TestStaleRoundTrip(t *testing.T) {
	cur := testToken()
	cur.Epoch++
	e := &ownership.StaleTokenError{Token: testToken(), Current: cur}
	err := StatusFromError(fmt.Errorf("write: %w", e))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("code %v", status.Code(err))
	}
	got, ok := StaleFromStatus(err)
	if !ok || got.Token != e.Token || got.Current != e.Current {
		t.Fatalf("StaleFromStatus = %+v %v", got, ok)
	}
	if !errors.Is(got, ownership.ErrStaleToken) {
		t.Fatal("decoded error is not ErrStaleToken")
	}
}

func TestStatusFromError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{ownership.ErrBadMAC, codes.Unauthenticated},
		{fmt.Errorf("x: %w", ownership.ErrMalformedToken), codes.InvalidArgument},
		{ownership.ErrPartitionRange, codes.InvalidArgument},
		{ownership.ErrNotFenced, codes.FailedPrecondition},
		{ownership.ErrLeaseEnded, codes.Unavailable},
		{ownership.ErrNoOwner, codes.Unavailable},
		{fmt.Errorf("commit: %w", ownership.ErrOutcomeUnknown), codes.Unknown},
		{notOwner("b", "b:1", 4), codes.FailedPrecondition},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{status.Error(codes.NotFound, "x"), codes.NotFound},
		{errors.New("other"), codes.Unknown},
	} {
		if got := status.Code(StatusFromError(tc.err)); got != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, got, tc.code)
		}
	}
	if StatusFromError(nil) != nil {
		t.Error("nil is not nil")
	}
	if _, ok := OwnerHint(StatusFromError(notOwner("b", "b:1", 4))); !ok {
		t.Error("a NotOwnerError lost its hint")
	}
}

func FuzzOwnerHint(f *testing.F) {
	good := NotOwnerStatus(ownership.OwnerInfo{Partition: 5, Node: "node-a", Addr: "h:1", Token: testToken()})
	_, ei := info(good)
	md := ei.GetMetadata()
	f.Add(md["partition"], md["owner"], md["address"], md["epoch"], md["token"])
	f.Add("5", "node-a", "h:1", "0", "")
	f.Add("-1", "", "", "x", "v1.")
	f.Add("4294967296", "a", "b", "18446744073709551616", "v1.AQA")
	f.Fuzz(func(t *testing.T, p, owner, addr, epoch, token string) {
		o, ok := decodeOwner(map[string]string{"partition": p, "owner": owner, "address": addr, "epoch": epoch, "token": token})
		if !ok {
			return
		}
		if n, err := strconv.ParseUint(p, 10, 32); err != nil || uint32(n) != o.Partition {
			t.Fatalf("partition %d from %q", o.Partition, p)
		}
		if o.Node == "" || len(o.Addr) > maxHintAddr {
			t.Fatalf("accepted a bad hint %+v", o)
		}
		if !o.Token.IsZero() && (o.Token.Owner != o.Node || o.Token.Partition != o.Partition) {
			t.Fatalf("token %v does not match owner %+v", o.Token, o)
		}
		// What decodes encodes back to the same hint (proto strings are
		// UTF-8, so only valid text goes on the wire).
		if !utf8.ValidString(o.Node) || !utf8.ValidString(o.Addr) {
			return
		}
		if back, ok := OwnerHint(NotOwnerStatus(o)); !ok || back != o {
			t.Fatalf("round trip: %+v %v, want %+v", back, ok, o)
		}
	})
}

func FuzzStaleFromStatus(f *testing.F) {
	cur := testToken()
	cur.Epoch++
	_, ei := info(StaleStatus(&ownership.StaleTokenError{Token: testToken(), Current: cur}))
	md := ei.GetMetadata()
	f.Add(md["token"], md["current_token"], ReasonStaleToken)
	f.Add("", "", ReasonStaleToken)
	f.Add("v1.x", "v1.", ReasonStaleToken)
	f.Add(md["token"], md["current_token"], ReasonNotOwner)
	f.Fuzz(func(t *testing.T, tok, current, reason string) {
		if !utf8.ValidString(tok) || !utf8.ValidString(current) || !utf8.ValidString(reason) {
			return // proto strings on the wire are UTF-8
		}
		err := withInfo(codes.FailedPrecondition, "stale", errorInfo(reason, map[string]string{"token": tok, "current_token": current}))
		st, ok := StaleFromStatus(err)
		if !ok {
			return
		}
		if reason != ReasonStaleToken {
			t.Fatalf("decoded a %q detail as stale", reason)
		}
		for _, c := range []struct {
			text string
			t    ownership.Token
		}{{tok, st.Token}, {current, st.Current}} {
			if c.text == "" {
				if !c.t.IsZero() {
					t.Fatalf("token %v from an empty text", c.t)
				}
				continue
			}
			if back := tokenString(t, c.t); back != c.text {
				t.Fatalf("%q decoded to %v, which encodes to %q", c.text, c.t, back)
			}
		}
	})
}

// notOwner is the coordinator's refusal for a key of partition 3.
func notOwner(node, addr string, epoch uint64) error {
	o := ownership.OwnerInfo{Partition: 3, Node: node, Addr: addr}
	if epoch > 0 {
		o.Token = ownership.Token{Partition: 3, Epoch: epoch, Owner: node, Incarnation: 1}
	}
	return &ownership.NotOwnerError{Owner: o}
}

func TestNotOwnerTrailer(t *testing.T) {
	md := NotOwnerTrailer(NotOwnerStatus(ownership.OwnerInfo{Partition: 5, Node: "node-a", Addr: "[::1]:7000", Token: testToken()}))
	if got := md.Get(OwnerMetadata); len(got) != 1 || got[0] != "node-a" {
		t.Errorf("%s = %q", OwnerMetadata, got)
	}
	if got := md.Get(OwnerAddrMetadata); len(got) != 1 || got[0] != "[::1]:7000" {
		t.Errorf("%s = %q", OwnerAddrMetadata, got)
	}
	// Without a token the name crosses as UTF-8 (U+FFFD for the bad byte).
	md = NotOwnerTrailer(NotOwnerStatus(ownership.OwnerInfo{Partition: 5, Node: "n\xff\n%"}))
	if got := md.Get(OwnerMetadata); len(got) != 1 || got[0] != "n%EF%BF%BD%0A%25" || md.Get(OwnerAddrMetadata) != nil {
		t.Errorf("no address, odd name: %v", md)
	}
	for _, err := range []error{nil, errors.New("x"), HandoffStatus(5, "a"), OutcomeUnknown("h:1", "lost"), status.Error(codes.FailedPrecondition, "plain")} {
		if md := NotOwnerTrailer(err); md != nil {
			t.Errorf("%v: trailer %v", err, md)
		}
	}
}
