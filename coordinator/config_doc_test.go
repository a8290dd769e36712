package coordinator

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tenure-go/tenure/ownership"
	"github.com/tenure-go/tenure/ring"
)

// configDefaults returns, for every field of Config whose doc comment in
// config.go has a "Default:" line, the text after "Default:" (up to the end
// of the comment, lines joined by spaces).
func configDefaults(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			if field.Doc == nil {
				continue
			}
			text := strings.Join(strings.Fields(field.Doc.Text()), " ")
			i := strings.Index(text, "Default:")
			if i < 0 {
				continue
			}
			for _, name := range field.Names {
				out[name.Name] = strings.TrimSpace(text[i+len("Default:"):])
			}
		}
		return false
	})
	if len(out) == 0 {
		t.Fatal("no Default: lines found in config.go's Config")
	}
	return out
}

// The three presets, by the names the Default lines use.
func presets() map[string]Config {
	return map[string]Config{"LAN": LANConfig(), "WAN": WANConfig(), "local": LocalConfig()}
}

// handBuilt is a Config built by hand: only the required fields set.
func handBuilt(t *testing.T) Config {
	t.Helper()
	c, err := Config{Name: "n", Handler: HandlerFuncs{}}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	perPresetDuration = regexp.MustCompile(`^LAN (\S+), WAN (\S+), local (\S+)\.$`)
	perPresetString   = regexp.MustCompile(`^(\w+) "([^"]*)" \(LAN, WAN\), "([^"]*)" \(local\)\.$`)
	oneString         = regexp.MustCompile(`^"([^"]*)"\.$`)
	memberlistBases   = regexp.MustCompile(`^LAN memberlist\.DefaultLANConfig\(\), WAN memberlist\.DefaultWANConfig\(\), local memberlist\.DefaultLocalConfig\(\) with faster probes and no compression \(see LocalConfig\); DeadNodeReclaimTime LAN (\S+), WAN (\S+), local (\S+)\.$`)
)

// Issue 11, defect 14: the Config comments disagreed with the presets
// (TickInterval local, StepDown LAN, RejoinInterval local), and a zero
// field did not always mean "the default" (HandoffTimeout 0 waited
// forever). Every "Default:" line of Config's doc comments is held to what
// LANConfig, WANConfig, LocalConfig and WithDefaults set; a Default line
// this test can't read fails it, so a new field can't slip past.
func TestConfigDocDefaults(t *testing.T) {
	for _, p := range checkConfigDocs(t, configDefaults(t)) {
		t.Error(p)
	}
}

// The check catches drift: the doc lines the issue found wrong, put back
// one at a time, are each reported.
func TestConfigDocDefaultsCatchDrift(t *testing.T) {
	for name, old := range map[string]string{
		"TickInterval":   "LAN 100ms, WAN 250ms, local 50ms.",
		"StepDown":       "LAN 5s, WAN 15s, local 500ms.",
		"RejoinInterval": "LAN 5s, WAN 15s, local 1s.",
		"ClusterName":    `"cluster".`,
		"BindAddr":       `BindAddr "0.0.0.0" (LAN, WAN), "0.0.0.0" (local).`,
		"Memberlist":     "memberlist.DefaultLANConfig(), with DeadNodeReclaimTime 30s.",
	} {
		docs := configDefaults(t)
		if _, ok := docs[name]; !ok {
			t.Fatalf("no Default line for %s", name)
		}
		docs[name] = old
		if len(checkConfigDocs(t, docs)) == 0 {
			t.Errorf("%s documented as %q: not reported", name, old)
		}
	}
}

// checkConfigDocs returns every disagreement between the Default lines in
// docs and the presets and WithDefaults.
func checkConfigDocs(t *testing.T, docs map[string]string) []string {
	var bad []string
	problem := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	hand := handBuilt(t)
	field := func(c Config, name string) reflect.Value { return reflect.ValueOf(c).FieldByName(name) }
	for name, text := range docs {
		if !field(hand, name).IsValid() {
			problem("Default line for %s, which is not a Config field", name)
			continue
		}
		switch {
		case perPresetDuration.MatchString(text):
			m := perPresetDuration.FindStringSubmatch(text)
			want := map[string]string{"LAN": m[1], "WAN": m[2], "local": m[3]}
			for preset, c := range presets() {
				d, err := time.ParseDuration(want[preset])
				if err != nil {
					problem("%s: Default %q: %v", name, text, err)
					continue
				}
				if got := field(c, name).Interface(); got != d {
					problem("%s: the doc says %s %v, %sConfig sets %v", name, preset, d, preset, got)
				}
			}
			if got, lan := field(hand, name).Interface(), field(LANConfig(), name).Interface(); got != lan {
				problem("%s: zero in a hand-built Config becomes %v, not the LAN default %v", name, got, lan)
			}
		case perPresetString.MatchString(text):
			m := perPresetString.FindStringSubmatch(text)
			if m[1] != name {
				problem("%s: its Default line names %s", name, m[1])
			}
			for preset, c := range presets() {
				want := m[2]
				if preset == "local" {
					want = m[3]
				}
				if got := field(c, name).String(); got != want {
					problem("%s: the doc says %s %q, %sConfig sets %q", name, preset, want, preset, got)
				}
			}
			if got := field(hand, name).String(); got != m[2] {
				problem("%s: zero in a hand-built Config becomes %q, not the LAN default %q", name, got, m[2])
			}
		case oneString.MatchString(text):
			want := oneString.FindStringSubmatch(text)[1]
			for preset, c := range presets() {
				if got := field(c, name).String(); got != want {
					problem("%s: the doc says %q, %sConfig sets %q", name, want, preset, got)
				}
			}
			if got := field(hand, name).String(); got != want {
				problem("%s: zero in a hand-built Config becomes %q, not %q", name, got, want)
			}
		case name == "Ring" && text == "ring.DefaultConfig().":
			for preset, c := range presets() {
				if c.Ring != ring.DefaultConfig() {
					problem("Ring: %sConfig sets %+v, not ring.DefaultConfig()", preset, c.Ring)
				}
			}
			if hand.Ring != ring.DefaultConfig() {
				problem("Ring: zero in a hand-built Config becomes %+v", hand.Ring)
			}
		case name == "Memberlist" && memberlistBases.MatchString(text):
			m := memberlistBases.FindStringSubmatch(text)
			bad = append(bad, checkMemberlistBase("LAN", LANConfig().Memberlist, memberlist.DefaultLANConfig(), m[1])...)
			bad = append(bad, checkMemberlistBase("WAN", WANConfig().Memberlist, memberlist.DefaultWANConfig(), m[2])...)
			bad = append(bad, checkMemberlistBase("local", LocalConfig().Memberlist, memberlist.DefaultLocalConfig(), m[3])...)
			bad = append(bad, checkMemberlistBase("hand-built", hand.Memberlist, memberlist.DefaultLANConfig(), m[1])...)
		case name == "Authority" && strings.HasPrefix(text, "the gossip authority"):
			for preset, c := range presets() {
				if c.Authority != nil {
					problem("Authority: %sConfig sets %T", preset, c.Authority)
				}
			}
			c, err := New(Config{Name: "n", Handler: HandlerFuncs{}})
			if err != nil {
				t.Fatal(err)
			}
			if a := c.Config().Authority; a == nil || a.Strict() {
				problem("Authority: a hand-built Config gets %T, not the gossip authority", a)
			}
			c.Close()
		case name == "Logger" && text == "discard.":
			if hand.Logger == nil || hand.Logger.Handler() != slog.DiscardHandler {
				problem("Logger: a hand-built Config gets %v, not a logger that discards", hand.Logger)
			}
		case name == "Clock" && text == "SystemClock().":
			if hand.Clock != SystemClock() {
				problem("Clock: a hand-built Config gets %T", hand.Clock)
			}
		case name == "Rand" && text == "a source seeded from crypto/rand.":
			a, b := handBuilt(t), handBuilt(t)
			if a.Rand == nil || a.Rand.Uint64() == b.Rand.Uint64() {
				problem("Rand: two hand-built Configs get no source, or the same one")
			}
		default:
			problem("%s: Default line %q: this test can't read it; teach it", name, text)
		}
	}
	// Every duration has a documented default, and zero means it.
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type != reflect.TypeFor[time.Duration]() {
			continue
		}
		if _, ok := docs[f.Name]; !ok {
			problem("%s: a duration without a Default line", f.Name)
		}
		if field(hand, f.Name).Int() == 0 {
			problem("%s: zero in a hand-built Config stays zero", f.Name)
		}
	}
	return bad
}

func checkMemberlistBase(preset string, got, base *memberlist.Config, reclaim string) []string {
	d, err := time.ParseDuration(reclaim)
	if err != nil {
		return []string{fmt.Sprintf("Memberlist: %s DeadNodeReclaimTime %q: %v", preset, reclaim, err)}
	}
	if got == nil {
		return []string{fmt.Sprintf("Memberlist: %s sets none", preset)}
	}
	var bad []string
	// Fields no preset overrides tell the bases apart.
	if got.IndirectChecks != base.IndirectChecks || got.RetransmitMult != base.RetransmitMult ||
		got.GossipNodes != base.GossipNodes || got.UDPBufferSize != base.UDPBufferSize {
		bad = append(bad, fmt.Sprintf("Memberlist: %s is not built on the documented base", preset))
	}
	// Compression is memberlist's default but for the local preset's.
	if want := base.EnableCompression && preset != "local"; got.EnableCompression != want {
		bad = append(bad, fmt.Sprintf("Memberlist: %s EnableCompression %v, the doc says %v", preset, got.EnableCompression, want))
	}
	if got.DeadNodeReclaimTime != d {
		bad = append(bad, fmt.Sprintf("Memberlist: %s DeadNodeReclaimTime %v, the doc says %v", preset, got.DeadNodeReclaimTime, d))
	}
	return bad
}

// Issue 11, defects 8 and 14: the effective Config is readable after New
// and before Start (a handler needs the partition count), and a hand-built
// Config waits for a live holder's release at most the default
// HandoffTimeout, not forever.
func TestEffectiveConfigBeforeStart(t *testing.T) {
	c, err := New(Config{Name: "n", Handler: HandlerFuncs{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := c.Config()
	if cfg.Ring.Partitions != ring.DefaultConfig().Partitions {
		t.Errorf("Config().Ring.Partitions = %d, want %d", cfg.Ring.Partitions, ring.DefaultConfig().Partitions)
	}
	if cfg.HandoffTimeout != LANConfig().HandoffTimeout || cfg.machineConfig(c.Self()).HandoffTicks == 0 {
		t.Errorf("a hand-built Config's HandoffTimeout is %v (%d ticks): a live holder is waited for forever",
			cfg.HandoffTimeout, cfg.machineConfig(c.Self()).HandoffTicks)
	}
}

// Issue 11, defect 14: after Close a lease's cause was context.Canceled.
// It wraps ownership.ErrLeaseEnded and ErrClosed, and the handler is told
// (Release, with the lease already ended).
func TestLeaseCauseAfterClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	released := make(chan error, testPartitions)
	cfg := testConfig("solo")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Handler = HandlerFuncs{ReleaseFunc: func(_ context.Context, l *ownership.Lease) error {
		released <- l.Err()
		return nil
	}}
	c := startAlone(ctx, t, cfg)
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.LeaseOfPartition(0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	cause := context.Cause(l.Context())
	if !errors.Is(cause, ownership.ErrLeaseEnded) || !errors.Is(cause, ErrClosed) {
		t.Fatalf("cause after Close = %v, want one wrapping ownership.ErrLeaseEnded and ErrClosed", cause)
	}
	if !errors.Is(l.Err(), ErrClosed) {
		t.Fatalf("Err after Close = %v", l.Err())
	}
	if len(released) != testPartitions {
		t.Fatalf("Close told the handler of %d of its %d leases", len(released), testPartitions)
	}
	for range testPartitions {
		if err := <-released; !errors.Is(err, ErrClosed) {
			t.Fatalf("Release at Close saw lease.Err() = %v", err)
		}
	}
}
