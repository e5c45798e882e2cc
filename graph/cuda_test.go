//go:build cuda

package graph_test

import (
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/graph"
)

// TestCUDADeviceAccepted: a cuda build accepts "cuda:N" and still rejects
// a device that is not one.
func TestCUDADeviceAccepted(t *testing.T) {
	if !graph.CUDA {
		t.Fatal("a cuda build must set graph.CUDA")
	}
	for dev, ok := range map[string]bool{"cuda:0": true, "cuda:3": true, "cuda:x": false, "gpu0": false} {
		src := strings.Replace(twoStages, `node = "sink"`, `node    = "sink"
  devices = ["cpu", "`+dev+`"]`, 1)
		l := &graph.Loader{Catalog: testRegistry()}
		g, diags := l.Load("spec.hcl", []byte(src))
		if (g != nil && !diags.HasErrors()) != ok {
			t.Errorf("devices %q: accepted %v, want %v:\n%s", dev, g != nil, ok, printed(l, diags))
		}
	}
}
