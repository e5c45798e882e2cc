package speceval

import (
	"strings"
	"testing"

	"github.com/dflow-dev/dflow/internal/nn"
)

// TestEvaluator: drafting with the target itself accepts every draft
// (tau = block size); drafting garbage accepts none (tau near 1).
func TestEvaluator(t *testing.T) {
	m, err := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 7)
	if err != nil {
		t.Fatal(err)
	}
	held := []byte(strings.Repeat("func main() { fmt.Println(\"hello\") }\n", 40))
	e := &Evaluator{Target: m, Layers: []int{0, 1}, Block: 4, Prompt: 16, Cycles: 5, Prompts: 3}
	oracle := func(ctx []int32, anchor int32, _ []float32, n int) []int32 {
		seq := append(append([]int32{}, ctx...), anchor)
		var out []int32
		for range n {
			ws, _ := m.NewWorkspace(1, len(seq))
			l := make([]float32, 256)
			m.Backend().ToHost(l, ws.Forward(seq).Slice((len(seq)-1)*256, 256))
			next := nn.Argmax(l)
			out = append(out, next)
			seq = append(seq, next)
		}
		return out
	}
	tau, err := e.Tau(held, oracle)
	if err != nil || tau != 4 {
		t.Errorf("oracle tau %v (%v), want 4", tau, err)
	}
	garbage := func(ctx []int32, anchor int32, _ []float32, n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = 255 // a byte the target never predicts on this text
		}
		return out
	}
	tau, _ = e.Tau(held, garbage)
	if tau > 1.2 {
		t.Errorf("garbage tau %v, want about 1", tau)
	}
}
