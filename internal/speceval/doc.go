// Package speceval measures a block drafter by speculative decoding: the
// target (an nn.Model) produces an anchor token and its hidden states, a
// proposer (a trained nn.Drafter, or the byte n-gram baseline) drafts
// the rest of a block, and the target verifies the draft greedily; the
// acceptance length tau is the mean accepted drafts per cycle + 1. It
// serves drafter_train's in-run evaluation (nodes/dflash) and `dflow
// eval` (Evaluate, with ResolveTarget picking the target a checkpoint
// records).
//
// Invariants: the target is only read, never modified, so an Evaluator
// may share it with other readers; an Evaluator itself (its workspaces)
// is used by one goroutine at a time. A checkpoint that records its
// target's SHA-256 is evaluated against a file of that content only,
// unless the caller forces another.
//
// It lives apart from internal/nn because it reads corpora and counts
// n-grams with nodes/text, which the numeric core does not import.
package speceval
