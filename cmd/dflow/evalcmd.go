package main

import (
	"flag"
	"fmt"

	"github.com/dflow-dev/dflow/internal/speceval"
)

func cmdEval(e *env, args []string) int {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	target := fs.String("target", "", "the target model to decode with (default: the one the drafter was trained against, as its checkpoint records; checked by the SHA-256 of its content)")
	force := fs.Bool("force-target", false, "evaluate against --target even when it is not the model the drafter was trained against")
	corpus := fs.String("corpus", "$GOROOT/src", "corpus whose held-out text to decode (as the training reader's)")
	holdout := fs.Float64("holdout", 0.05, "held-out share of the corpus, more than 0 and less than 1, as the reader's")
	seed := fs.Uint64("seed", 1, "split seed, as the reader's")
	maxBytes := fs.Int64("max-bytes", 16<<20, "corpus cap in bytes, as the reader's")
	prompts := fs.Int("prompts", 16, "held-out prompts (at least 1)")
	cycles := fs.Int("cycles", 12, "draft/verify cycles per prompt (at least 1)")
	files, code, ok := parse(e, fs, args, "DRAFTER.safetensors [flags]")
	if !ok {
		return code
	}
	switch {
	case len(files) != 1:
		return usageErr(e, "eval", "want one drafter checkpoint, got %d", len(files))
	case *prompts < 1:
		return usageErr(e, "eval", "--prompts %d: want at least 1 prompt", *prompts)
	case *cycles < 1:
		return usageErr(e, "eval", "--cycles %d: want at least 1 cycle per prompt", *cycles)
	case !(*holdout > 0 && *holdout < 1):
		return usageErr(e, "eval", "--holdout %g: want a share of the corpus more than 0 and less than 1 (0.05 holds out 5%%)", *holdout)
	case *maxBytes < 1:
		return usageErr(e, "eval", "--max-bytes %d: want at least 1 byte", *maxBytes)
	case *force && *target == "":
		return usageErr(e, "eval", "--force-target needs --target FILE, the target to evaluate against")
	}
	res, err := speceval.Evaluate(speceval.EvalOptions{Drafter: files[0], Target: *target, ForceTarget: *force,
		Corpus: *corpus, Holdout: *holdout, Seed: *seed, MaxBytes: *maxBytes, Prompts: *prompts, Cycles: *cycles,
		Note: func(s string) { fmt.Fprintf(e.stderr, "dflow eval: note: %s\n", s) }})
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow eval: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(e.stdout, "acceptance length (tau = accepted drafts per cycle + 1; at most %d), %d held-out prompts x %d cycles, target %s\n", res.Block, *prompts, *cycles, res.Target)
	fmt.Fprintf(e.stdout, "  drafter  %-32s %.3f\n", files[0], res.Drafter)
	fmt.Fprintf(e.stdout, "  n-gram   %-32s %.3f\n", "order 3 on the training text", res.NGram)
	return exitOK
}
