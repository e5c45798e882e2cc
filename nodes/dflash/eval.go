package dflash

import (
	"fmt"

	"github.com/dflow-dev/dflow/nodes/text"
)

// EvalResult is what Evaluate measures.
type EvalResult struct {
	Block          int
	Prompts        int
	Drafter, NGram float64 // acceptance lengths
}

// Evaluate measures a saved drafter's acceptance length against the
// target on a corpus's held-out text, next to an order-3 n-gram drafter
// counted on the training text (dflow eval).
func Evaluate(targetPath, drafterPath, corpus string, holdout float64, seed uint64, maxBytes int64, prompts, cycles int) (*EvalResult, error) {
	target, err := loadShared(targetPath)
	if err != nil {
		return nil, err
	}
	d, _, err := LoadDrafter(drafterPath, target.P("wte"), nil)
	if err != nil {
		return nil, err
	}
	if d.Config.D != target.Config.DModel {
		return nil, fmt.Errorf("dflash: drafter %s is %d wide, target %s is %d", drafterPath, d.Config.D, targetPath, target.Config.DModel)
	}
	data, err := text.ReadCorpus(corpus, maxBytes)
	if err != nil {
		return nil, err
	}
	train, held := text.Split(data, holdout, seed)
	taps := d.Config.Taps
	if len(taps) == 0 {
		taps = DefaultLayers(target.Config.Layers, d.Config.K)
	}
	e := &Evaluator{Target: target, Layers: taps, Block: d.Config.BlockSize,
		Prompt: 48, Cycles: cycles, Prompts: prompts}
	res := &EvalResult{Block: d.Config.BlockSize, Prompts: prompts}
	if res.Drafter, err = e.Tau(held, DrafterProposer(d)); err != nil {
		return nil, err
	}
	if res.NGram, err = e.Tau(held, NGramProposer(text.NewNGram(train[:min(len(train), 4<<20)], 3))); err != nil {
		return nil, err
	}
	return res, nil
}
