package nn

import (
	"fmt"
	"strconv"
	"strings"
)

// ForDevice returns the backend a replica placed on dev runs on: the CPU
// backend for "cpu" (and ""), a CUDA backend for "cuda:N" in a build with
// -tags cuda. Each call for a CUDA device returns a backend of its own,
// with its own stream and cuBLAS handle, over the device's one context
// and compiled kernels: a replica calls it once and keeps it. Buffers of
// two backends on one device may be passed to either (a shared model's
// weights); the CPU backend is one value.
func ForDevice(dev string) (Backend, error) {
	if dev == "" || dev == "cpu" {
		return cpu, nil
	}
	n, ok := strings.CutPrefix(dev, "cuda:")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || i < 0 {
		return nil, fmt.Errorf("nn: device %q is not known: use \"cpu\" or \"cuda:N\"", dev)
	}
	return openCUDA(i)
}

// queued is what a backend that queues work (a device's stream)
// implements beside Backend.
type queued interface {
	// Synchronize waits for the work queued so far.
	Synchronize()
	// shares says a buffer of other may be passed to this backend's Copy
	// and Accumulate (the all-reduce's; another device's is copied once).
	shares(other Backend) bool
}

// Synchronize waits until the work be has queued is done: a no-op on the
// CPU. Code that hands a buffer to another backend's stream (an
// all-reduce, an item on an edge) synchronizes first.
func Synchronize(be Backend) {
	if q, ok := be.(queued); ok {
		q.Synchronize()
	}
}

// Shares reports whether buffers of b may be passed to a's Copy and
// Accumulate: the same backend, or two CUDA backends.
func Shares(a, b Backend) bool {
	if a == b {
		return true
	}
	q, ok := a.(queued)
	return ok && q.shares(b)
}
