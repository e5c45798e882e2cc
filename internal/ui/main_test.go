package ui

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain fails the package's tests if a goroutine outlives them: every
// server a test starts, its live feed and the browsers that read it must
// be gone once the test has cleaned up.
func TestMain(m *testing.M) { testutil.Main(m) }
