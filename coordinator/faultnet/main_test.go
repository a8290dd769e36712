package faultnet

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines patiently, as
// tenuretest.VerifyTestMain does (which this package can't import: it is
// built on it): memberlist's probe goroutines outlive its Shutdown by up to
// a probe round, so the check is retried for several seconds.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for i := 0; err != nil && i < 8; i++ {
			err = goleak.Find() // each Find retries for about a second
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
