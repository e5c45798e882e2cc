package speceval

import (
	"fmt"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes/text"
)

// Speculative decoding, the way acceptance length is measured: the target
// produces one token (the anchor) and its hidden states; the drafter (or a
// baseline) drafts BlockSize-1 more; the target verifies them greedily in
// one forward pass and keeps the longest prefix that matches its own
// greedy choices. tau = mean accepted drafts per cycle + 1.

// A Proposer drafts n tokens after ctx, given the target's anchor token
// and tapped hidden states at the last context position.
type Proposer func(ctx []int32, anchor int32, hidden []float32, n int) []int32

// Evaluator measures acceptance length on held-out text.
type Evaluator struct {
	Target  *nn.Model
	Layers  []int // the tapped target layers
	Block   int   // block size
	Prompt  int   // bytes of held-out context per prompt
	Cycles  int   // draft/verify cycles per prompt
	Prompts int
	works   map[int]*nn.Workspace
}

func (e *Evaluator) work(T int) *nn.Workspace {
	if e.works == nil {
		e.works = map[int]*nn.Workspace{}
	}
	if w, ok := e.works[T]; ok {
		return w
	}
	w, _ := e.Target.NewWorkspace(1, T)
	e.works[T] = w
	return w
}

// Tau runs speculative decoding from Prompts prompts taken evenly from
// held, and returns the mean accepted drafts per cycle + 1.
func (e *Evaluator) Tau(held []byte, propose Proposer) (float64, error) {
	c := e.Target.Config
	if e.Prompt+e.Block > c.MaxSeq {
		return 0, fmt.Errorf("speceval: prompt %d + block %d exceed the target's max_seq %d", e.Prompt, e.Block, c.MaxSeq)
	}
	stride := len(held) / max(e.Prompts, 1)
	if stride < e.Prompt {
		return 0, fmt.Errorf("speceval: %d held-out bytes are too few for %d prompts of %d", len(held), e.Prompts, e.Prompt)
	}
	hidden := make([]float32, len(e.Layers)*c.DModel)
	be := e.Target.Backend()
	row := make([]float32, c.Vocab)
	// argmax is the greedy token at position pos of logits, read on the
	// host.
	argmax := func(logits nn.Buffer, pos int) int32 {
		be.ToHost(row, logits.Slice(pos*c.Vocab, c.Vocab))
		return nn.Argmax(row)
	}
	// read takes the anchor (the greedy token after position pos) and the
	// tapped hidden states at pos from a forward pass's workspace.
	read := func(w *nn.Workspace, logits nn.Buffer, pos int) int32 {
		for k, l := range e.Layers {
			be.ToHost(hidden[k*c.DModel:(k+1)*c.DModel], w.Hidden(l).Slice(pos*c.DModel, c.DModel))
		}
		return argmax(logits, pos)
	}
	var accepted, cycles int
	for p := 0; p < e.Prompts; p++ {
		ctx := make([]int32, 0, c.MaxSeq)
		for _, b := range held[p*stride : p*stride+e.Prompt] {
			ctx = append(ctx, int32(b))
		}
		// known: anchor and hidden already hold what a forward pass over
		// ctx gives at its last position. The causal target's outputs at
		// a position depend only on the tokens up to it, so the verify
		// pass, which ran over ctx and more, gave them; only a window
		// shifted to make room needs the pass again.
		var anchor int32
		known := false
		for cyc := 0; cyc < e.Cycles; cyc++ {
			// Keep room for the block in the window.
			if len(ctx) > c.MaxSeq-e.Block {
				ctx = append(ctx[:0], ctx[len(ctx)-(c.MaxSeq-e.Block):]...)
				known = false
			}
			L := len(ctx)
			if !known {
				w := e.work(L)
				anchor = read(w, w.Forward(ctx), L-1)
			}
			draft := propose(ctx, anchor, hidden, e.Block-1)
			// Verify: run the target over ctx + anchor + draft.
			seq := append(append(append([]int32{}, ctx...), anchor), draft...)
			vw := e.work(len(seq))
			vl := vw.Forward(seq)
			a := 0
			for j, d := range draft {
				pos := L + j // the position holding the token before d
				if argmax(vl, pos) != d {
					break
				}
				a++
			}
			accepted += a
			cycles++
			ctx = append(ctx, anchor)
			ctx = append(ctx, draft[:a]...)
			anchor, known = read(vw, vl, L+a), true
		}
	}
	return float64(accepted)/float64(max(cycles, 1)) + 1, nil
}

// DrafterProposer drafts with a trained drafter.
func DrafterProposer(d *nn.Drafter) Proposer {
	w := d.NewWork(1)
	out := make([]int32, 0, d.Config.BlockSize)
	return func(ctx []int32, anchor int32, hidden []float32, n int) []int32 {
		w.Sample(0, hidden, anchor, nil)
		w.Forward()
		return w.Draft(0, out)
	}
}

// NGramProposer drafts greedily with a byte n-gram: the baseline a
// drafter must beat.
func NGramProposer(ng *text.NGram) Proposer {
	return func(ctx []int32, anchor int32, _ []float32, n int) []int32 {
		hist := make([]byte, 0, len(ctx)+n+1)
		for _, t := range ctx {
			hist = append(hist, byte(t))
		}
		hist = append(hist, byte(anchor))
		out := make([]int32, 0, n)
		for range n {
			best, bp := 0, -1.0
			for b := 0; b < 256; b++ {
				if p := ng.Prob(hist[max(0, len(hist)-ng.Order):], byte(b)); p > bp {
					best, bp = b, p
				}
			}
			hist = append(hist, byte(best))
			out = append(out, int32(best))
		}
		return out
	}
}
