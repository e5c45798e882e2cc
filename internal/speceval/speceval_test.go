package speceval

import (
	"slices"
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
		return greedy(m, ctx, anchor, n, func(next int32) int32 { return next })
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

// TestTauReusesTheVerifyPass: Tau takes each cycle's anchor and hidden
// states from the previous cycle's verify pass; a proposer gets what
// running the target again over the accepted context gives, bit for bit
// (on the CPU backend, whose sums at a position run in the same order
// whatever the sequence's length), across a window shifted to make room
// too (64 positions, 16 + 20 cycles of up to 4), and the measure is the
// same.
func TestTauReusesTheVerifyPass(t *testing.T) {
	m, err := nn.NewModel(nn.Config{Vocab: 256, DModel: 16, Layers: 2, Heads: 2, Hidden: 24, MaxSeq: 64}, 7)
	if err != nil {
		t.Fatal(err)
	}
	held := []byte(strings.Repeat("func main() { fmt.Println(\"hello\") }\n", 40))
	// proposer drafts the target's own greedy tokens with every fourth
	// one wrong (3 a cycle: the cycles accept 3, 0, 1, 2 in turn), and
	// records what it is given.
	type call struct {
		ctx    []int32
		anchor int32
		hidden []float32
	}
	proposer := func(calls *[]call) Proposer {
		n := 0
		return func(ctx []int32, anchor int32, hidden []float32, k int) []int32 {
			*calls = append(*calls, call{append([]int32{}, ctx...), anchor, append([]float32{}, hidden...)})
			return greedy(m, ctx, anchor, k, func(next int32) int32 {
				if n++; n%4 == 0 {
					return 255
				}
				return next
			})
		}
	}
	e := &Evaluator{Target: m, Layers: []int{0, 1}, Block: 4, Prompt: 16, Cycles: 20, Prompts: 3}
	var got, want []call
	tau, err := e.Tau(held, proposer(&got))
	if err != nil {
		t.Fatal(err)
	}
	w, accepts := tauTwoPasses(e, held, proposer(&want))
	if tau != w {
		t.Errorf("tau %v, want %v (a forward pass per cycle)", tau, w)
	}
	if accepts[0] == 0 || accepts[e.Block-1] == 0 {
		t.Errorf("cycles by drafts accepted %v: the comparison needs cycles that accept none and all", accepts)
	}
	if tau <= 1.5 || tau >= 4 {
		t.Errorf("tau %v: the comparison needs cycles that accept some drafts and reject others", tau)
	}
	if len(got) != len(want) {
		t.Fatalf("%d proposals, want %d", len(got), len(want))
	}
	for i := range got {
		if !slices.Equal(got[i].ctx, want[i].ctx) || got[i].anchor != want[i].anchor || !slices.Equal(got[i].hidden, want[i].hidden) {
			t.Fatalf("proposal %d: context of %d, anchor %d, hidden %v; want %d, %d, %v", i,
				len(got[i].ctx), got[i].anchor, got[i].hidden[:4], len(want[i].ctx), want[i].anchor, want[i].hidden[:4])
		}
	}
}

// tauTwoPasses is Tau as it was first written: a forward pass over the
// context for the anchor, and another to verify, every cycle. It also
// counts the cycles by drafts accepted.
func tauTwoPasses(e *Evaluator, held []byte, propose Proposer) (float64, map[int]int) {
	accepts := map[int]int{}
	c, be := e.Target.Config, e.Target.Backend()
	row := make([]float32, c.Vocab)
	argmax := func(logits nn.Buffer, pos int) int32 {
		be.ToHost(row, logits.Slice(pos*c.Vocab, c.Vocab))
		return nn.Argmax(row)
	}
	hidden := make([]float32, len(e.Layers)*c.DModel)
	stride := len(held) / e.Prompts
	var accepted, cycles int
	for p := 0; p < e.Prompts; p++ {
		var ctx []int32
		for _, b := range held[p*stride : p*stride+e.Prompt] {
			ctx = append(ctx, int32(b))
		}
		for range e.Cycles {
			if len(ctx) > c.MaxSeq-e.Block {
				ctx = append([]int32{}, ctx[len(ctx)-(c.MaxSeq-e.Block):]...)
			}
			L := len(ctx)
			w, _ := e.Target.NewWorkspace(1, L)
			logits := w.Forward(ctx)
			anchor := argmax(logits, L-1)
			for k, l := range e.Layers {
				be.ToHost(hidden[k*c.DModel:(k+1)*c.DModel], w.Hidden(l).Slice((L-1)*c.DModel, c.DModel))
			}
			draft := propose(ctx, anchor, hidden, e.Block-1)
			seq := append(append(append([]int32{}, ctx...), anchor), draft...)
			vw, _ := e.Target.NewWorkspace(1, len(seq))
			vl := vw.Forward(seq)
			a := 0
			for j, d := range draft {
				if argmax(vl, L+j) != d {
					break
				}
				a++
			}
			accepted += a
			accepts[a]++
			cycles++
			ctx = append(append(ctx, anchor), draft[:a]...)
		}
	}
	return float64(accepted)/float64(cycles) + 1, accepts
}

// greedy drafts n tokens after ctx and anchor with the target's own
// greedy choices, each passed through alter before it is drafted.
func greedy(m *nn.Model, ctx []int32, anchor int32, n int, alter func(int32) int32) []int32 {
	seq := append(append([]int32{}, ctx...), anchor)
	var out []int32
	l := make([]float32, m.Config.Vocab)
	for range n {
		ws, _ := m.NewWorkspace(1, len(seq))
		m.Backend().ToHost(l, ws.Forward(seq).Slice((len(seq)-1)*m.Config.Vocab, m.Config.Vocab))
		next := alter(nn.Argmax(l))
		out = append(out, next)
		seq = append(seq, next)
	}
	return out
}
