// Package gpuguard stops a cuda build of dflow, in dflow's own words, on
// a machine without an NVIDIA GPU, before gorgonia.org/cu's package init
// runs: that init calls cuInit and, where it fails, prints a CUDA error
// and exits with status 1 before main.
//
// Order: Go initializes a program's packages sorted by import path, each
// step the first package whose imports are all initialized (the Go 1.21
// specification). This package imports only os, which cu imports too,
// and "github.com/dflow-dev/..." sorts before "gorgonia.org/cu", so
// whenever cu could be initialized this package can be, and comes first.
// The cuda build's internal/nn imports it beside cu (guard_cuda.go holds
// the init; the default build has none, and never imports cu).
//
// What it checks is what the driver needs to find a GPU: the device
// nodes /dev/nvidiactl and /dev/nvidia0..N (or WSL's /dev/dxg). A machine
// with no driver at all has no libcuda.so.1 either, and the dynamic
// loader refuses a cuda binary before any of its code runs, with its own
// message ("libcuda.so.1: cannot open shared object file"); docs/models.md
// says what that means.
package gpuguard

import "os"

// Message is what a cuda build says on a machine without a GPU.
const Message = "dflow: this dflow was built with -tags cuda, which needs an NVIDIA GPU and its driver, " +
	"and this machine has none (no /dev/nvidiactl and /dev/nvidia0, nor /dev/dxg).\n" +
	"The default build (go build ./cmd/dflow, without -tags cuda) runs every node on the CPU; " +
	"set DFLOW_CUDA_SKIP_GUARD=1 to let the CUDA driver report the problem itself.\n"

// Present reports whether the machine shows an NVIDIA device to this
// process, through exists (os.Stat in the program, a fake in tests).
func Present(exists func(path string) bool) bool {
	if exists("/dev/dxg") {
		return true
	}
	if !exists("/dev/nvidiactl") {
		return false
	}
	for i := 0; i < 64; i++ {
		if exists("/dev/nvidia" + itoa(i)) {
			return true
		}
	}
	return false
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Check is the guard: it writes Message and exits with status 1 when no
// device is present, unless DFLOW_CUDA_SKIP_GUARD is set.
func Check() {
	if os.Getenv("DFLOW_CUDA_SKIP_GUARD") != "" || Present(exists) {
		return
	}
	os.Stderr.WriteString(Message)
	os.Exit(1)
}
