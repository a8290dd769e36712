package chaos

import (
	"os"
	"testing"

	"github.com/tenure-go/tenure/internal/leakcheck"
)

func TestMain(m *testing.M) {
	// The SIGSTOP nemesis re-executes this test binary as a cluster node.
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	leakcheck.VerifyTestMain(m)
}
