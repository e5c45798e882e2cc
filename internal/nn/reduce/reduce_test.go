package reduce

import (
	"testing"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes"
)

// TestSum: the accumulator adds members in order and stores the total; a
// host vector is refused.
func TestSum(t *testing.T) {
	be := nn.CPU()
	a, b := be.Alloc(3), be.Alloc(3)
	be.FromHost(a, []float32{1, 2, 3})
	be.FromHost(b, []float32{10, 20, 30})
	s := Of(a).NewSum()
	if err := s.Add(Of(a)); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(Of(b)); err != nil {
		t.Fatal(err)
	}
	if err := s.Store(Of(b)); err != nil {
		t.Fatal(err)
	}
	Of(b).Scale(0.5)
	got := make([]float32, 3)
	be.ToHost(got, b)
	if got[0] != 5.5 || got[1] != 11 || got[2] != 16.5 {
		t.Errorf("sum/2 = %v", got)
	}
	if err := s.Add(nodes.Floats{1, 2, 3}); err == nil {
		t.Error("a host vector added to a buffer's sum: want an error")
	}
}
