package ranks

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain fails the package's tests if a goroutine outlives them: the
// embedded servers must be gone once their test has cleaned up.
func TestMain(m *testing.M) {
	testutil.Main(m)
}
