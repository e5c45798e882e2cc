// Package reduce lets a replica group all-reduce an nn.Buffer where it
// lives: Of(b) is a nodes.Reducible whose Sum is a buffer of b's backend,
// added to with the backend's Accumulate and stored with its Copy, so a
// device buffer is summed on the device and never crosses to the host.
// On the CPU backend this is exactly the group's []float32 path: a zeroed
// accumulator, each member's values added in arrival order, the total
// copied back.
package reduce

import (
	"fmt"
	"runtime"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes"
)

// Of returns b as a vector a replica group can all-reduce.
func Of(b nn.Buffer) nodes.Reducible { return vec{b} }

type vec struct{ b nn.Buffer }

func (v vec) Len() int        { return v.b.Len() }
func (v vec) Scale(f float32) { v.b.Backend().Scale(v.b, f) }

// CopyToHost implements nodes.HostCopier: the buffer's values cross to
// the host once (a cluster's group sums them there).
func (v vec) CopyToHost(dst []float32) { v.b.Backend().ToHost(dst, v.b) }

// CopyFromHost implements nodes.HostCopier.
func (v vec) CopyFromHost(src []float32) { v.b.Backend().FromHost(v.b, src) }
func (v vec) NewSum() nodes.Sum {
	be := v.b.Backend()
	s := &sum{be: be, acc: be.Alloc(v.b.Len())}
	// A sum is dropped after its round, by no one in particular: its
	// accumulator goes back to the backend when the sum is collected (a
	// device backend's pool; the CPU's Free does nothing).
	runtime.AddCleanup(s, func(acc nn.Buffer) { be.Free(acc) }, s.acc)
	return s
}

// sum is one all-reduce's accumulator, on the first member's backend.
type sum struct {
	be  nn.Backend
	acc nn.Buffer
}

func (s *sum) buffer(x nodes.Reducible) (nn.Buffer, error) {
	v, ok := x.(vec)
	if !ok {
		return nn.Buffer{}, fmt.Errorf("all-reduce of a %s buffer with a %T", s.be.Name(), x)
	}
	if !nn.Shares(s.be, v.b.Backend()) {
		return nn.Buffer{}, fmt.Errorf("all-reduce of a %s buffer with a %s one", s.be.Name(), v.b.Backend().Name())
	}
	return v.b, nil
}

func (s *sum) Add(x nodes.Reducible) error {
	b, err := s.buffer(x)
	if err != nil {
		return err
	}
	nn.Synchronize(b.Backend()) // the member's stream has written its values
	s.be.Accumulate(s.acc, b)
	return nil
}

func (s *sum) Store(x nodes.Reducible) error {
	b, err := s.buffer(x)
	if err != nil {
		return err
	}
	s.be.Copy(b, s.acc)
	nn.Synchronize(s.be) // the total is there before the member's stream reads it
	return nil
}
