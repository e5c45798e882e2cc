// Package nn holds dflow's numeric core: float32 forward and backward
// kernels over flat row-major buffers, in the spirit of llm.c, with
// gonum's BLAS for the matrix products (OpenBLAS with -tags openblas),
// the byte-level target LM built from them (model.go, forward.go), the
// DFlash-style block drafter trained on its hidden states (drafter.go:
// Drafter, DrafterWork, and its checkpoints), AdamW, and safetensors
// files with their metadata (who wrote a model, and whether a run may
// replace it).
//
// Invariants: each kernel is a plain function of buffers and sizes, so
// another backend can implement the same signatures. Backward kernels
// accumulate (+=) into gradient buffers, so a buffer used twice (a tied
// embedding, a residual) gets both gradients; callers zero gradients
// before a step. A model's parameters are one flat buffer (Params) that
// its named tensors view (P); a view shared with another model (the
// drafter reads its target's embedding) is read-only to the borrower.
//
// Shapes: N rows of width D; a linear layer's weight is [Out, In] and its
// output is in @ W^T + b; attention reads qkv [B, T, 3C] (q, k, v
// concatenated per position) and writes [B, T, C].
package nn
