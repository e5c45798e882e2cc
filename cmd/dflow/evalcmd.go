package main

import (
	"flag"
	"fmt"

	"github.com/dflow-dev/dflow/nodes/dflash"
)

func cmdEval(e *env, args []string) int {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	target := fs.String("target", "models/target.safetensors", "the target model")
	corpus := fs.String("corpus", "$GOROOT/src", "corpus whose held-out text to decode (as the training reader's)")
	holdout := fs.Float64("holdout", 0.05, "held-out share, as the reader's")
	seed := fs.Uint64("seed", 1, "split seed, as the reader's")
	maxBytes := fs.Int64("max-bytes", 16<<20, "corpus cap, as the reader's")
	prompts := fs.Int("prompts", 16, "held-out prompts")
	cycles := fs.Int("cycles", 12, "draft/verify cycles per prompt")
	files, code, ok := parse(e, fs, args, "DRAFTER.safetensors [flags]")
	if !ok {
		return code
	}
	if len(files) != 1 {
		return usageErr(e, "eval", "want one drafter checkpoint")
	}
	res, err := dflash.Evaluate(*target, files[0], *corpus, *holdout, *seed, *maxBytes, *prompts, *cycles)
	if err != nil {
		fmt.Fprintf(e.stderr, "dflow eval: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(e.stdout, "acceptance length (tau = accepted drafts per cycle + 1; at most %d), %d held-out prompts x %d cycles\n", res.Block, *prompts, *cycles)
	fmt.Fprintf(e.stdout, "  drafter  %-32s %.3f\n", files[0], res.Drafter)
	fmt.Fprintf(e.stdout, "  n-gram   %-32s %.3f\n", "order 3 on the training text", res.NGram)
	return exitOK
}
