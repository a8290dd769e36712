package faultnet

import (
	"testing"

	"github.com/tenure-go/tenure/internal/leakcheck"
)

// TestMain fails the run if goroutines are left over, waiting out
// memberlist's, which outlive its Shutdown by a bounded time (see
// leakcheck.Upstream).
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
