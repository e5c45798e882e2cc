//go:build cuda

package cudalib

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain fails the package's tests if a goroutine they started
// outlives them, and exits without the race runtime's second.
func TestMain(m *testing.M) { testutil.Main(m) }
