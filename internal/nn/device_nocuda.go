//go:build !cuda

package nn

import "fmt"

// CUDAEnabled reports whether this build has the CUDA backend.
const CUDAEnabled = false

func openCUDA(i int) (Backend, error) {
	return nil, fmt.Errorf("nn: device \"cuda:%d\" needs dflow's CUDA backend, and this dflow is built without it "+
		"(build with -tags cuda; docs/models.md says how)", i)
}
