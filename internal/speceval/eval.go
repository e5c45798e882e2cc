package speceval

import (
	"fmt"

	"github.com/dflow-dev/dflow/internal/nn"
	"github.com/dflow-dev/dflow/nodes/text"
)

// DefaultTarget is the target a drafter that records none is evaluated
// against: the shipped model.
const DefaultTarget = "models/target.safetensors"

// EvalOptions says what Evaluate measures.
type EvalOptions struct {
	Drafter string // the drafter checkpoint
	// Target is the target to decode with; "" means the one the
	// checkpoint records (drafter_train records its path and SHA-256).
	Target string
	// ForceTarget evaluates against Target even when its content is not
	// the target the drafter was trained against.
	ForceTarget bool
	Corpus      string  // whose held-out text is decoded
	Holdout     float64 // held-out share, as the training reader's
	Seed        uint64  // split seed, as the reader's
	MaxBytes    int64   // corpus cap, as the reader's
	Prompts     int
	Cycles      int // draft/verify cycles per prompt
	// Note, if set, is told what the caller should know but that does
	// not stop the evaluation (a target that cannot be checked).
	Note func(string)
}

// EvalResult is what Evaluate measures.
type EvalResult struct {
	Block          int
	Prompts        int
	Target         string  // the target decoded with
	Drafter, NGram float64 // acceptance lengths
}

// ResolveTarget picks the target a saved drafter is evaluated against,
// from its checkpoint's metadata: explicit when given, else the recorded
// path. When the checkpoint records the target's SHA-256 the chosen file
// must have that content; a mismatch is an error unless force. A
// checkpoint without a hash (an older dflow) is used with the path alone,
// with a note saying so.
func ResolveTarget(drafter string, meta map[string]string, explicit string, force bool) (path string, notes []string, err error) {
	rec, recHash := meta["target"], meta["target_sha256"]
	path = explicit
	if path == "" {
		path = rec
	}
	if path == "" {
		path = DefaultTarget
		return path, []string{fmt.Sprintf("%s does not record the target it was trained against; using %s unchecked (--target to choose)", drafter, path)}, nil
	}
	if recHash == "" {
		if explicit == "" {
			return path, []string{fmt.Sprintf("%s records its target %s but no hash of it (saved by an older dflow): using that path unchecked", drafter, rec)}, nil
		}
		return path, []string{fmt.Sprintf("%s records no hash of its target (saved by an older dflow): using --target %s unchecked", drafter, path)}, nil
	}
	h, err := nn.FileSHA256(path)
	switch {
	case err != nil && explicit == "":
		return "", nil, fmt.Errorf("%s was trained against %s (sha256 %s), which cannot be read (%v); pass --target FILE with that model", drafter, rec, short(recHash), err)
	case err != nil:
		return "", nil, fmt.Errorf("--target: %w", err)
	case h == recHash:
		return path, nil, nil
	case force:
		return path, []string{fmt.Sprintf("evaluating against %s (sha256 %s), which is not the target %s was trained against (%s, sha256 %s), as --force-target asks",
			path, short(h), drafter, rec, short(recHash))}, nil
	case explicit == "":
		return "", nil, fmt.Errorf("%s was trained against %s (sha256 %s), but that file now holds another model (sha256 %s); "+
			"pass --target FILE with the model it was trained against, or add --target %s --force-target to evaluate against this one anyway",
			drafter, rec, short(recHash), short(h), rec)
	default:
		return "", nil, fmt.Errorf("--target %s (sha256 %s) is not the target %s was trained against (%s, sha256 %s); "+
			"leave --target out to use that one, or add --force-target to evaluate against %s anyway",
			path, short(h), drafter, rec, short(recHash), path)
	}
}

// Evaluate measures a saved drafter's acceptance length against its target
// on a corpus's held-out text, next to an order-3 n-gram drafter counted
// on the training text (dflow eval).
func Evaluate(o EvalOptions) (*EvalResult, error) {
	switch {
	case o.Prompts < 1:
		return nil, fmt.Errorf("speceval: %d prompts: want at least 1", o.Prompts)
	case o.Cycles < 1:
		return nil, fmt.Errorf("speceval: %d cycles: want at least 1", o.Cycles)
	case !(o.Holdout > 0 && o.Holdout < 1):
		return nil, fmt.Errorf("speceval: held-out share %g: want more than 0 and less than 1", o.Holdout)
	}
	meta, err := nn.ReadSafetensorsMetadata(o.Drafter)
	if err != nil {
		return nil, err
	}
	c, err := nn.CheckDrafterMeta(o.Drafter, meta)
	if err != nil {
		return nil, err
	}
	targetPath, notes, err := ResolveTarget(o.Drafter, meta, o.Target, o.ForceTarget)
	if err != nil {
		return nil, err
	}
	if o.Note != nil {
		for _, n := range notes {
			o.Note(n)
		}
	}
	target, _, err := nn.LoadModel(targetPath)
	if err != nil {
		return nil, err
	}
	tc := target.Config
	if c.D != tc.DModel {
		return nil, fmt.Errorf("speceval: drafter %s is %d wide, target %s is %d", o.Drafter, c.D, targetPath, tc.DModel)
	}
	taps := c.Taps
	if len(taps) == 0 {
		taps = nn.DefaultTaps(tc.Layers, c.K)
	}
	for _, l := range taps {
		if l < 0 || l >= tc.Layers {
			return nil, fmt.Errorf("speceval: drafter %s taps block %d, which the %d-block target %s lacks", o.Drafter, l, tc.Layers, targetPath)
		}
	}
	d, _, err := nn.LoadDrafter(o.Drafter, target.P("wte"), nil)
	if err != nil {
		return nil, err
	}
	data, err := text.ReadCorpus(o.Corpus, o.MaxBytes)
	if err != nil {
		return nil, err
	}
	train, held := text.Split(data, o.Holdout, o.Seed)
	e := &Evaluator{Target: target, Layers: taps, Block: c.BlockSize,
		Prompt: 48, Cycles: o.Cycles, Prompts: o.Prompts}
	res := &EvalResult{Block: c.BlockSize, Prompts: o.Prompts, Target: targetPath}
	if res.Drafter, err = e.Tau(held, DrafterProposer(d)); err != nil {
		return nil, err
	}
	if res.NGram, err = e.Tau(held, NGramProposer(text.NewNGram(train[:min(len(train), 4<<20)], 3))); err != nil {
		return nil, err
	}
	return res, nil
}

// short abbreviates a hash for messages.
func short(h string) string { return h[:min(len(h), 12)] }
