//go:build linux

package netns

import (
	"fmt"
	"os"
	"testing"

	"github.com/tenure-go/tenure/internal/leakcheck"
)

// TestMain runs the tests, or, when the no-root test starts this binary as
// an unprivileged user, tries to build a Net and prints what New said.
func TestMain(m *testing.M) {
	if os.Getenv(noRootEnv) != "" {
		_, err := New("a")
		fmt.Println(err)
		os.Exit(0)
	}
	leakcheck.VerifyTestMain(m)
}
