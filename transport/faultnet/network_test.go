package faultnet

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestLinkRules(t *testing.T) {
	type check struct {
		from, to string
		down     bool
	}
	tests := []struct {
		name   string
		faults func(n *Network) error
		checks []check
	}{
		{
			name:   "no faults",
			faults: func(n *Network) error { return nil },
			checks: []check{{"a", "b", false}, {"b", "a", false}},
		},
		{
			name:   "partition splits groups both ways",
			faults: func(n *Network) error { return n.Partition([]string{"a", "b"}, []string{"c"}) },
			checks: []check{
				{"a", "b", false}, {"b", "a", false},
				{"a", "c", true}, {"c", "a", true},
				{"b", "c", true}, {"c", "b", true},
			},
		},
		{
			name:   "unlisted node bridges",
			faults: func(n *Network) error { return n.Partition([]string{"a"}, []string{"b"}) },
			checks: []check{
				{"a", "b", true}, {"b", "a", true},
				{"a", "x", false}, {"x", "a", false},
				{"b", "x", false}, {"x", "b", false},
			},
		},
		{
			name: "later partition replaces earlier",
			faults: func(n *Network) error {
				if err := n.Partition([]string{"a"}, []string{"b"}); err != nil {
					return err
				}
				return n.Partition([]string{"a", "b"}, []string{"c"})
			},
			checks: []check{{"a", "b", false}, {"a", "c", true}},
		},
		{
			name: "empty partition removes it",
			faults: func(n *Network) error {
				if err := n.Partition([]string{"a"}, []string{"b"}); err != nil {
					return err
				}
				return n.Partition()
			},
			checks: []check{{"a", "b", false}, {"b", "a", false}},
		},
		{
			name:   "cut is one way",
			faults: func(n *Network) error { n.Cut("a", "b"); return nil },
			checks: []check{{"a", "b", true}, {"b", "a", false}, {"a", "c", false}},
		},
		{
			name:   "isolate cuts every link of the node",
			faults: func(n *Network) error { n.Isolate("a"); return nil },
			checks: []check{{"a", "b", true}, {"b", "a", true}, {"b", "c", false}},
		},
		{
			name:   "unknown endpoints and self pass",
			faults: func(n *Network) error { n.Isolate("a"); return nil },
			checks: []check{{"", "a", false}, {"a", "", false}, {"a", "a", false}},
		},
		{
			name: "heal removes everything",
			faults: func(n *Network) error {
				if err := n.Partition([]string{"a"}, []string{"b"}); err != nil {
					return err
				}
				n.Cut("b", "c")
				n.Isolate("d")
				n.Heal()
				return nil
			},
			checks: []check{{"a", "b", false}, {"b", "c", false}, {"d", "a", false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := New()
			if err := tt.faults(n); err != nil {
				t.Fatal(err)
			}
			for _, c := range tt.checks {
				n.mu.Lock()
				got := n.linkDownLocked(c.from, c.to)
				n.mu.Unlock()
				if got != c.down {
					t.Errorf("link %q -> %q down = %v, want %v", c.from, c.to, got, c.down)
				}
			}
		})
	}
}

func TestInvalidArguments(t *testing.T) {
	n := New()
	n.Cut("a", "b")
	checks := []struct {
		name string
		err  error
	}{
		{"partition duplicate", n.Partition([]string{"a", "b"}, []string{"b"})},
		{"partition empty name", n.Partition([]string{""})},
		{"drop negative", n.Drop(-0.1)},
		{"drop above one", n.Drop(1.5)},
		{"drop NaN", n.Drop(math.NaN())},
		{"delay negative", n.Delay(-time.Millisecond)},
	}
	for _, c := range checks {
		if !errors.Is(c.err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, c.err)
		}
	}
	_, err := n.Transport("", TransportConfig{})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("empty name: err = %v, want ErrInvalid", err)
	}
	_, err = n.Transport("a", TransportConfig{BindPort: 70000})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("bad port: err = %v, want ErrInvalid", err)
	}
	// A rejected call changes nothing.
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.groups) != 0 || n.drop != 0 || n.delay != 0 {
		t.Errorf("rejected calls changed faults: groups %v drop %v delay %v", n.groups, n.drop, n.delay)
	}
	if !n.linkDownLocked("a", "b") {
		t.Error("rejected calls removed an earlier cut")
	}
}

func TestDropFractionIsSeeded(t *testing.T) {
	const packets = 2000
	run := func(seed uint64) uint64 {
		n := New(WithSeed(seed))
		if err := n.Drop(0.25); err != nil {
			t.Fatal(err)
		}
		for range packets {
			n.sendPacket("a", "127.0.0.1:9")
		}
		sent, dropped := n.Stats()
		if sent != packets {
			t.Fatalf("sent = %d, want %d", sent, packets)
		}
		return dropped
	}
	d1, d2 := run(7), run(7)
	if d1 != d2 {
		t.Errorf("same seed dropped %d then %d packets", d1, d2)
	}
	if d1 < packets/5 || d1 > packets*3/10 {
		t.Errorf("dropped %d of %d packets at fraction 0.25", d1, packets)
	}
}

func BenchmarkSendDecision(b *testing.B) {
	n := New()
	if err := n.Partition([]string{"a", "b"}, []string{"c"}); err != nil {
		b.Fatal(err)
	}
	if err := n.Drop(0.1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		n.sendPacket("a", "127.0.0.1:7946")
	}
}

// Mute drops the packets a node sends, and nothing else: its streams pass
// both ways, it still receives packets, and Heal ends it. The negative
// control is the unmuted node beside it.
func TestMuteDropsOnlyTheNodesPackets(t *testing.T) {
	n := New()
	n.Mute("a")
	if n.sendPacket("a", "127.0.0.1:1") {
		t.Error("a muted node's packet was sent")
	}
	if !n.sendPacket("b", "127.0.0.1:1") {
		t.Error("an unmuted node's packet was dropped")
	}
	n.mu.Lock()
	down := n.linkDownLocked("b", "a") || n.linkDownLocked("a", "b")
	n.mu.Unlock()
	if down {
		t.Error("Mute took a link down: the muted node must still receive packets and open streams")
	}
	if err := n.dialCheck("a", "b"); err != nil {
		t.Errorf("a muted node's stream dial refused: %v", err)
	}
	if sent, dropped := n.Stats(); sent != 2 || dropped != 1 {
		t.Errorf("Stats = %d sent, %d dropped; want 2 and 1", sent, dropped)
	}
	n.Heal()
	if !n.sendPacket("a", "127.0.0.1:1") {
		t.Error("Heal did not end the mute")
	}
}
