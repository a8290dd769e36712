package natssource_test

import (
	"testing"

	"github.com/tenure-go/tenure/coordinator/tenuretest"
)

func TestMain(m *testing.M) { tenuretest.VerifyTestMain(m) }
