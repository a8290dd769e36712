package chaos

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The SIGSTOP nemesis re-executes this test binary as a cluster node.
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}
