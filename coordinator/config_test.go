package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/ownership"
)

// Issue 19, defect 6: Validate accepted Grace <= StepDown, which Grace's
// doc forbids (the reach check's window, three quarters of Grace minus
// StepDown, then silently shrank to three probe intervals). Every preset
// validates; Grace equal to or below StepDown, given or left to a default,
// is an error that names both.
func TestConfigValidateGraceAboveStepDown(t *testing.T) {
	presets := map[string]Config{"LAN": LANConfig(), "WAN": WANConfig(), "local": LocalConfig()}
	for name, c := range presets {
		c.Name, c.Handler = "n", HandlerFuncs{}
		if err := c.Validate(); err != nil {
			t.Errorf("%s preset: %v", name, err)
		}
	}
	lan := LANConfig()
	for _, tc := range []struct {
		name            string
		grace, stepDown time.Duration
		ok              bool
	}{
		{"grace equal", 2 * time.Second, 2 * time.Second, false},
		{"grace below", time.Second, 2 * time.Second, false},
		{"grace below the default StepDown", lan.StepDown / 2, 0, false},
		{"StepDown above the default Grace", 0, lan.Grace, false},
		{"grace above", 3 * time.Second, 2 * time.Second, true},
		{"defaults", 0, 0, true},
	} {
		c := Config{Name: "n", Handler: HandlerFuncs{}, Grace: tc.grace, StepDown: tc.stepDown}
		err := c.Validate()
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && err == nil:
			t.Errorf("%s: Grace %v, StepDown %v accepted", tc.name, tc.grace, tc.stepDown)
		case !tc.ok && !(strings.Contains(err.Error(), "Grace") && strings.Contains(err.Error(), "StepDown")):
			t.Errorf("%s: the error does not name Grace and StepDown: %v", tc.name, err)
		}
	}
}

// A BindAddr that is not an IP address is refused by Validate (memberlist's
// NetTransport bound such a name to every interface, silently), unless a
// transport of the caller's own does the binding.
func TestConfigValidateBindAddr(t *testing.T) {
	for _, tc := range []struct {
		bind      string
		transport bool
		ok        bool
	}{
		{"127.0.0.1", false, true},
		{"::1", false, true},
		{"0.0.0.0", false, true},
		{"", false, true}, // the preset's
		{"localhost", false, false},
		{"10.0.0.1:7946", false, false},
		{"localhost", true, true},
	} {
		c := LocalConfig()
		c.Name, c.Handler, c.BindAddr = "n", HandlerFuncs{}, tc.bind
		if tc.transport {
			ml := *c.Memberlist
			ml.Transport = &memberlist.MockTransport{}
			c.Memberlist = &ml
		}
		err := c.Validate()
		switch {
		case tc.ok && err != nil:
			t.Errorf("BindAddr %q (own transport %v): %v", tc.bind, tc.transport, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "BindAddr")):
			t.Errorf("BindAddr %q accepted, or refused without naming BindAddr: %v", tc.bind, err)
		}
	}
}

// A node's metadata shows a new stable membership at most once per a
// quarter of StableAfter (showFraction), as its comment says: 1.25 s on
// the local preset, 7.5 s on LAN, 15 s on WAN.
func TestShowTicksAreAQuarterOfStableAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"local", LocalConfig(), 1250 * time.Millisecond},
		{"lan", LANConfig(), 7500 * time.Millisecond},
		{"wan", WANConfig(), 15 * time.Second},
	} {
		got := time.Duration(c.cfg.machineConfig(ownership.Node{Name: "a"}).ShowTicks) * c.cfg.TickInterval
		if got < c.want || got >= c.want+c.cfg.TickInterval {
			t.Errorf("%s: shows at most once per %v, want %v (rounded up to a tick)", c.name, got, c.want)
		}
	}
}
