package coordinator

import (
	"strings"
	"testing"
	"time"
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
