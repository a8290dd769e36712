package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
	"github.com/tenure-go/tenure/ownership"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }

// A wire is a real gRPC server on loopback whose one method answers each
// call with the error its request describes, and a client connection to
// it: what a status becomes after one hop is what the client reads back.
type wire struct {
	cc *grpc.ClientConn
}

const wireMethod = "/tenure.transport.test.Wire/Fail"

// wireFrame packs strings for a request: proto strings must be UTF-8, the
// ones under test need not be.
func wireFrame(parts ...string) []byte {
	var b []byte
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

func wireUnframe(b []byte) ([]string, error) {
	var parts []string
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, errors.New("bad frame")
		}
		parts = append(parts, string(b[k:k+int(n)]))
		b = b[k+int(n):]
	}
	return parts, nil
}

// newWire starts the server; build turns a request's strings into the
// error the handler returns.
func newWire(t testing.TB, build func(parts []string) error) *wire {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "tenure.transport.test.Wire",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Fail", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			parts, err := wireUnframe(in.GetValue())
			if err != nil {
				return nil, err
			}
			return nil, build(parts)
		}}},
	}, struct{}{})
	go func() { _ = s.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		s.Stop()
	})
	return &wire{cc: cc}
}

// call sends parts and returns the error the client reads.
func (w *wire) call(t testing.TB, parts ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := w.cc.Invoke(ctx, wireMethod, wrapperspb.Bytes(wireFrame(parts...)), new(wrapperspb.StringValue))
	if err == nil {
		t.Fatal("the call succeeded")
	}
	return err
}

// wireStatus builds, on the server, the status a request names: its kind
// and up to two strings.
func wireStatus(parts []string) error {
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	a, b := parts[1], parts[2]
	switch parts[0] {
	case "unknown":
		return OutcomeUnknown(a, b)
	case "unknown-wrapped": // what a fence returns, through StatusFromError
		return StatusFromError(fmt.Errorf("commit %s: %w: %s", a, ownership.ErrOutcomeUnknown, b))
	case "notowner":
		return NotOwnerStatus(ownership.OwnerInfo{Partition: 5, Node: a, Addr: b, Token: ownership.Token{Partition: 5, Epoch: 9, Owner: a, Incarnation: 3}})
	case "handoff":
		return HandoffStatus(5, a)
	case "stale":
		return StaleStatus(&ownership.StaleTokenError{
			Token:   ownership.Token{Partition: 5, Epoch: 8, Owner: b, Incarnation: 1},
			Current: ownership.Token{Partition: 5, Epoch: 9, Owner: a, Incarnation: 2},
		})
	case "notfenced":
		return StatusFromError(fmt.Errorf("%s: %w", a, ownership.ErrNotFenced))
	}
	return fmt.Errorf("no kind %q", parts[0])
}

// wireText is what a string sent in a status may become: valid UTF-8,
// every invalid byte sequence replaced.
func wireText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// Every status tenure builds is classified the same after a real gRPC
// hop, whatever text it carries: a multibyte character straddling the
// reason's cut, bytes that are not UTF-8 (a driver's message in a legacy
// encoding), a huge reason. Before, such an unknown outcome reached the
// client as a plain Unknown: a definite failure, and a committed write
// retried.
func TestStatusesSurviveTheWire(t *testing.T) {
	w := newWire(t, wireStatus)
	straddle := strings.Repeat("a", maxReason-1) + "é tail" // é is bytes 1023 and 1024
	for _, tc := range []struct{ addr, reason string }{
		{"h:1", straddle},
		{"h:1", "commit: connection reset; server said \xff\xfe\xc3 (Latin-1: Verbindungsabbruch w\xe4hrend des Commits)"},
		{"h:\xff1", "plain"},
		{"", strings.Repeat("日本語のエラー", 400)},
		{"h:1", strings.Repeat("\xe2\x82", 800)}, // truncated euro signs, all of them
		{"h:1", ""},
	} {
		for _, kind := range []string{"unknown", "unknown-wrapped"} {
			err := w.call(t, kind, tc.addr, tc.reason)
			ou, ok := AsOutcomeUnknown(err)
			if !ok || !IsOutcomeUnknown(err) {
				t.Errorf("%s (%.40q, %.40q...): the client reads %.200v (code %v), not an unknown outcome", kind, tc.addr, tc.reason, err, status.Code(err))
				continue
			}
			if !utf8.ValidString(ou.Reason) || len(ou.Reason) > maxReason {
				t.Errorf("%s: reason %d bytes, valid UTF-8 %v", kind, len(ou.Reason), utf8.ValidString(ou.Reason))
			}
			if kind != "unknown" {
				continue
			}
			if want := wireText(tc.reason); !strings.HasPrefix(want, ou.Reason) || len(ou.Reason) < min(len(want), maxReason-utf8.UTFMax) {
				t.Errorf("reason %.60q... (%d bytes) is not the start of %.60q... (%d bytes)", ou.Reason, len(ou.Reason), want, len(want))
			}
			if ou.Addr != wireText(tc.addr) {
				t.Errorf("address %q, want %q", ou.Addr, wireText(tc.addr))
			}
		}
	}

	for _, name := range []string{"node-a", "nöde-ä", "n\xffde", strings.Repeat("\xc3", 40)} {
		err := w.call(t, "notowner", name, "adr\xe9sse:7000")
		h, ok := OwnerHint(err)
		if !ok || status.Code(err) != codes.FailedPrecondition || h.Partition != 5 || h.Addr != wireText("adr\xe9sse:7000") || h.Node != name {
			t.Errorf("not owner %q: the client reads %v: hint %+v %v", name, err, h, ok)
		}
		if ok && (h.Token.Epoch != 9 || h.Token.Owner != name) {
			t.Errorf("not owner %q: token %v lost", name, h.Token)
		}
		if err := w.call(t, "handoff", name); !IsHandoff(err) {
			t.Errorf("handoff to %q: the client reads %v", name, err)
		}
		err = w.call(t, "stale", name, "old\xff")
		st, ok := StaleFromStatus(err)
		if !ok || st.Current.Owner != name || st.Current.Epoch != 9 || st.Token.Owner != "old\xff" {
			t.Errorf("stale, current owner %q: the client reads %v: %+v %v", name, err, st, ok)
		}
		if err := w.call(t, "notfenced", name); !hasReason(err, codes.FailedPrecondition, ReasonNotFenced) {
			t.Errorf("not fenced (%q): the client reads %v", name, err)
		}
	}
}

// hasReason reports whether err is a status with code c and a tenure
// detail of reason r.
func hasReason(err error, c codes.Code, r string) bool {
	code, ei := info(err)
	return code == c && ei != nil && ei.GetReason() == r
}

// wireKinds are the statuses FuzzStatusWire builds, by wireStatus's names.
var wireKinds = []string{"unknown", "unknown-wrapped", "notowner", "handoff", "stale", "notfenced"}

// Every status tenure builds, from any text (an unknown outcome's reason
// and address, an owner's name and address), is classified the same once
// it has crossed the wire: marshalled as grpc-go marshals it into
// grpc-status-details-bin (a status that does not marshal loses its
// details), and over a real gRPC connection, which also percent-encodes
// the message into grpc-message.
func FuzzStatusWire(f *testing.F) {
	for _, c := range []struct{ a, b string }{
		{"h:1", strings.Repeat("a", maxReason-1) + "é tail"},
		{"h:1", "server said \xff\xfe\xc3 w\xe4hrend"},
		{"h:\xff1", "plain"},
		{"", strings.Repeat("日本語", 200)},
		{"node-a", "10.0.0.1:7000"},
		{"n\xffde", "adr\xe9sse:7000"},
		{strings.Repeat("\xc3", ownership.MaxOwnerSize), "h:1"},
		{"%41 100%", "%zz"},
		{"", ""},
	} {
		for k := range wireKinds {
			f.Add(uint8(k), c.a, c.b)
		}
	}
	w := newWire(f, wireStatus)
	f.Fuzz(func(t *testing.T, k uint8, a, b string) {
		kind := wireKinds[int(k)%len(wireKinds)]
		built := wireStatus([]string{kind, a, b})
		st, ok := status.FromError(built)
		if !ok {
			t.Fatalf("%s: %v is not a status", kind, built)
		}
		raw, err := proto.Marshal(st.Proto())
		if err != nil {
			t.Fatalf("%s (%q, %q): the status does not marshal, and would lose its details: %v", kind, a, b, err)
		}
		var p spb.Status
		if err := proto.Unmarshal(raw, &p); err != nil {
			t.Fatal(err)
		}
		checkWire(t, kind, a, b, status.FromProto(&p).Err())
		checkWire(t, kind, a, b, w.call(t, kind, a, b))
	})
}

// checkWire asserts what a client must read of the status wireStatus
// built for kind, a and b.
func checkWire(t *testing.T, kind, a, b string, err error) {
	t.Helper()
	switch kind {
	case "unknown", "unknown-wrapped":
		ou, ok := AsOutcomeUnknown(err)
		if !ok || !IsOutcomeUnknown(err) || status.Code(err) != codes.Unknown {
			t.Fatalf("%s (%q, %q): read as %.300v, not an unknown outcome", kind, a, b, err)
		}
		if !utf8.ValidString(ou.Reason) || len(ou.Reason) > maxReason || len(ou.Addr) > maxHintAddr {
			t.Fatalf("%s: unbounded or invalid fields %q %q", kind, ou.Addr, ou.Reason)
		}
		if kind == "unknown" {
			if want := wireText(b); !strings.HasPrefix(want, ou.Reason) || len(ou.Reason) < min(len(want), maxReason-utf8.UTFMax) {
				t.Fatalf("reason %q is not the start of %q", ou.Reason, want)
			}
			if want := wireText(a); len(want) <= maxHintAddr && ou.Addr != want {
				t.Fatalf("address %q, want %q", ou.Addr, want)
			}
		}
	case "notowner":
		if !hasReason(err, codes.FailedPrecondition, ReasonNotOwner) {
			t.Fatalf("not owner %q at %q: read as %.300v", a, b, err)
		}
		h, ok := OwnerHint(err)
		want := a != "" && len(a) <= ownership.MaxOwnerSize && len(wireText(b)) <= maxHintAddr
		if ok != want || ok && (h.Node != a || h.Addr != wireText(b) || h.Partition != 5 || h.Token.Epoch != 9 || h.Token.Owner != a) {
			t.Fatalf("not owner %q at %q: hint %+v %v, want one: %v", a, b, h, ok, want)
		}
	case "handoff":
		if !IsHandoff(err) {
			t.Fatalf("handoff to %q: read as %.300v", a, err)
		}
	case "stale":
		if !hasReason(err, codes.FailedPrecondition, ReasonStaleToken) {
			t.Fatalf("stale (%q, %q): read as %.300v", a, b, err)
		}
		st, ok := StaleFromStatus(err)
		if len(a) <= ownership.MaxOwnerSize && len(b) <= ownership.MaxOwnerSize && (!ok || st.Current.Owner != a || st.Token.Owner != b || st.Current.Epoch != 9) {
			t.Fatalf("stale (%q, %q): %+v %v", a, b, st, ok)
		}
	case "notfenced":
		if !hasReason(err, codes.FailedPrecondition, ReasonNotFenced) {
			t.Fatalf("not fenced (%q): read as %.300v", a, err)
		}
	}
}
