package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: every
// share's background work, answerer, fetcher, data plane and every
// embedded server must be gone once their test has cleaned up.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
