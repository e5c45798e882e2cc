package netport

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain fails the package's tests if a goroutine outlives them.
func TestMain(m *testing.M) { testutil.Main(m) }
