// Package lm provides lm_train: it trains dflow's byte-level target
// language model (internal/nn) on batches from text_reader, data-parallel
// over its replicas, and evaluates it on the corpus's held-out text
// against an n-gram baseline.
//
// Invariants: every replica holds the same weights after each step (the
// gradient is all-reduced before the update); the model file records the
// run that wrote it, and a different run never replaces it unless the
// stage says overwrite = true.
package lm
