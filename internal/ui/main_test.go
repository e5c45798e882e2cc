package ui

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: every
// server a test starts, its live feed and the browsers that read it must
// be gone once the test has cleaned up.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
