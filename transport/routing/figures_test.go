package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenure-go/tenure/internal/testkit"
	"github.com/tenure-go/tenure/transport"
)

// TestFigures prints the package's figures (`go test ./transport -run
// TestFigures -v`) and asserts the targets that don't depend on timing:
// through a graceful leave and through a crash of one of three nodes,
// every call succeeds and the resource accepts no stale write; routing
// adds few allocations per call. Speed is in BenchmarkRoutedCall and
// BenchmarkDirectCall.
func TestFigures(t *testing.T) {
	for _, sc := range []struct {
		name string
		run  func(*testing.T) scenario
	}{{"leave", leaveScenario}, {"crash", func(t *testing.T) scenario { return crashScenario(t, true) }}} {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.run(t)
			fmt.Printf("figure: %s_calls %d\n", sc.name, s.calls)
			fmt.Printf("figure: %s_failed_calls %d\n", sc.name, s.errors)
			fmt.Printf("figure: %s_outcome_unknown %d\n", sc.name, s.unknown)
			fmt.Printf("figure: %s_attempts_cancelled %d\n", sc.name, s.cancelled)
			fmt.Printf("figure: %s_retries_deduplicated %d\n", sc.name, s.dupes)
			fmt.Printf("figure: %s_router_retries %d\n", sc.name, s.retries)
			fmt.Printf("figure: %s_router_redirects %d\n", sc.name, s.redirects)
			fmt.Printf("figure: %s_fenced_writes %d\n", sc.name, s.writes)
			fmt.Printf("figure: %s_stale_writes_accepted %d\n", sc.name, s.staleWrites)
			fmt.Printf("figure: %s_until_converged_ms %d\n", sc.name, s.recovery.Milliseconds())
			if s.errors != 0 || s.staleWrites != 0 {
				t.Errorf("%d failed calls, %d stale writes accepted; want 0 and 0", s.errors, s.staleWrites)
			}
		})
	}

	t.Run("allocs", func(t *testing.T) {
		c := singleNode(t, "solo", nil)
		n := newBufNet(t)
		n.guarded("solo", c)
		r := n.router(c, nil)
		cc := directConn(t, n, "solo")
		ctx := testkit.Ctx(t, 30*time.Second)
		out := new(wrapperspb.StringValue)
		call := func(cc grpc.ClientConnInterface, ctx context.Context) func() {
			return func() {
				if err := cc.Invoke(ctx, methodPut, benchPayload, out); err != nil {
					t.Fatal(err)
				}
			}
		}
		routed := testing.AllocsPerRun(200, func() { call(r, transport.WithKey(ctx, benchKey))() })
		direct := testing.AllocsPerRun(200, func() {
			call(cc, metadata.AppendToOutgoingContext(ctx, transport.KeyMetadata, string(benchKey)))()
		})
		fmt.Printf("figure: routed_call_allocs %.0f\n", routed)
		fmt.Printf("figure: direct_call_allocs %.0f\n", direct)
		fmt.Printf("figure: routing_extra_allocs_per_call %.0f\n", routed-direct)
		// An attempt costs its own context (which the router cancels when
		// the owner leaves), the attempt and its codec option; the route
		// itself stays on the stack.
		if routed-direct > 14 {
			t.Errorf("routing adds %.0f allocations per call, want at most 14", routed-direct)
		}
	})
}
