//go:build cuda

package cudalib

import (
	"os"
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/nn/cudakern"
)

// TestCompileKernels: the kernels' source compiles through NVRTC to PTX
// for Ampere (compute_80) and Hopper (compute_90), with one entry per
// kernel, and without warnings. It needs libnvrtc (the real library, not
// the link stub) and no GPU; it skips without libnvrtc unless
// DFLOW_REQUIRE_NVRTC is set (CI sets it where it fetched the library).
func TestCompileKernels(t *testing.T) {
	if err := LoadNVRTC(); err != nil {
		if os.Getenv("DFLOW_REQUIRE_NVRTC") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ma, mi, err := NVRTCVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC %d.%d", ma, mi)
	for _, arch := range []string{"compute_80", "compute_90"} {
		ptx, log, err := Compile(cudakern.Source, "dflow_kernels.cu", arch)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(log, "warning") {
			t.Errorf("%s: NVRTC warns:\n%s", arch, log)
		}
		if !strings.Contains(ptx, ".target sm_"+strings.TrimPrefix(arch, "compute_")) {
			t.Errorf("%s: the PTX names another target", arch)
		}
		if _, err := CompileKernels(arch); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d kernels, %d bytes of PTX", arch, len(cudakern.Names), len(ptx))
	}
}

// TestCompileError: a kernel that does not compile is an error that
// carries NVRTC's log.
func TestCompileError(t *testing.T) {
	if err := LoadNVRTC(); err != nil {
		t.Skip(err)
	}
	_, log, err := Compile(`extern "C" __global__ void k(float* x) { x[0] = undefined_name; }`, "bad.cu", "compute_80")
	if err == nil || !strings.Contains(log, "undefined_name") {
		t.Fatalf("err %v, log %q: want an error naming the identifier", err, log)
	}
}
