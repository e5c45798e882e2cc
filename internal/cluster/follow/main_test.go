package follow

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain fails the package's tests if a goroutine outlives them: a
// test's share, its ledger, its records and its server must be gone once
// the test has cleaned up.
func TestMain(m *testing.M) { testutil.Main(m) }
