package host

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain runs 4 tests at a time even on 2 cores (they wait on their
// members' requests more than they compute), and fails the package's
// tests if a goroutine outlives them.
func TestMain(m *testing.M) {
	testutil.WaitingTests(4)
	testutil.Main(m)
}
