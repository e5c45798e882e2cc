package python

import (
	"path/filepath"
	"testing"

	"github.com/dflow-dev/dflow/plugins/conformance"
)

// TestConformance: the protocol's suite against the Python SDK, through
// this example plugin (stats passes items on, zip and fork as the suite
// asks), skipped where Debian's python3 lacks grpcio, protobuf or numpy.
func TestConformance(t *testing.T) {
	python(t)
	stats, err := filepath.Abs("stats.py")
	if err != nil {
		t.Fatal(err)
	}
	conformance.Run(t, conformance.Plugin{
		Path:   "dflow-plugin-pystats",
		Marker: stats, // the launcher execs python3 .../stats.py
		Pass: conformance.Pass{Kind: "stats", Items: "items", Crash: "crash_after",
			CrashLine: "stats: crashing on purpose after 7 items", Slow: "sleep = 1"},
		Zip:  "zip",
		Fork: "fork",
	})
}
