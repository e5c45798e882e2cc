package share

import (
	"os"
	"testing"

	"github.com/dflow-dev/dflow/internal/testutil"
)

// TestMain runs 4 tests at a time even on 2 cores (most wait on leases,
// deadlock confirmations and slow steps more than they compute), and
// fails the package's tests if a goroutine outlives them: every share's
// background work, answerer, fetcher, data plane and every embedded
// server must be gone once their test has cleaned up.
func TestMain(m *testing.M) {
	if role := os.Getenv(echoEnv); role != "" {
		// one of BenchmarkRoundTrip's or BenchmarkCreditLoop's other
		// processes: no tests, so nothing to check for goroutines left
		echo(role)
		return
	}
	testutil.WaitingTests(4)
	testutil.Main(m)
}
