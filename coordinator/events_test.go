package coordinator

import "testing"

// TestEventKindNames holds each kind's name, which logs and the status
// timeline print, and the deprecated EventReleased to the kind it names.
func TestEventKindNames(t *testing.T) {
	want := map[EventKind]string{
		0:                      "event(?)",
		EventMemberJoined:      "member-joined",
		EventMemberLeft:        "member-left",
		EventAcquired:          "acquired",
		EventLeaseEnded:        "lease-ended",
		EventLeaving:           "leaving",
		EventHolderChanged:     "holder-changed",
		EventMemberLeaving:     "member-leaving",
		EventMemberLeaving + 1: "event(?)",
	}
	for k, name := range want {
		if got := k.String(); got != name {
			t.Errorf("EventKind(%d).String() = %q, want %q", k, got, name)
		}
	}
	if EventReleased != EventLeaseEnded {
		t.Errorf("EventReleased = %v, want EventLeaseEnded", EventReleased)
	}
}
