// Package nn holds dflow's numeric core: float32 forward and backward
// kernels over flat row-major buffers, in the spirit of llm.c, with
// gonum's BLAS for the matrix products (OpenBLAS with -tags openblas),
// the byte-level target LM built from them (model.go, forward.go), the
// DFlash-style block drafter trained on its hidden states (drafter.go:
// Drafter, DrafterWork, and its checkpoints), AdamW, and safetensors
// files with their metadata (who wrote a model, and whether a run may
// replace it).
//
// # The backend seam
//
// The models run through a Backend (backend.go) over opaque Buffers
// (float32) and Ints (int32): weights, gradients, optimizer moments and
// activations are buffers in the backend's memory, and the model code
// never indexes them. The CPU backend (cpu.go; CPU, Default) keeps them
// in Go slices and runs this package's kernel functions (EmbeddingForward,
// MatMulForward, AttentionForward, ...), which stay plain functions of
// host slices and sizes: the CPU backend's results are those functions',
// bit for bit (TestBitIdentical holds hashes recorded before the seam).
// Its GEMM is gonum's, or OpenBLAS's with -tags openblas: a build-tag
// variant of the same backend, not another one. A device backend (CUDA,
// issue 22) implements Backend with device memory; nothing in the
// interface is a host slice except the four named crossings, FromHost,
// ToHost, IntsFromHost and IntsToHost, used at the edges only: loading
// and saving safetensors (LoadModelOn, Tensors, Save), the tokens and
// targets a batch brings, the hidden states and greedy tokens an item
// carries on an edge, and metrics (a loss and a gradient norm come back
// as host scalars). Replicas all-reduce gradient buffers through
// internal/nn/reduce, whose Sum lives on the buffer's backend (Alloc,
// Accumulate, Copy): a device buffer is summed on the device.
//
// What an implementation must guarantee:
//
//   - Ordering. Calls made by one goroutine take effect in the order they
//     are made, as if each ran to completion before the next began: a
//     kernel sees every earlier write, a ToHost returns the values of
//     every earlier kernel, and a FromHost's source may be reused once it
//     returns. A device backend may queue work on a stream, but must
//     synchronize where a value reaches the host (ToHost, IntsToHost,
//     CrossEntropy's loss, SumSquares).
//   - Arithmetic. The CPU backend defines the results. Another backend
//     may differ by rounding (its own reduction orders and fused
//     operations) but not in meaning; issue 22 holds a device to 1e-3
//     relative of the CPU on logits and on a training step.
//   - Aliasing. Add's output may alias an input; in every other kernel
//     the buffers written (out, dx, dweight, ...) must not overlap the
//     buffers read, except that accumulating kernels read their own
//     output. Views (Buffer.Slice) of one allocation may be passed
//     together where they do not overlap. A Buffer of another backend is
//     an error (the CPU backend panics).
//   - Accumulation. Kernels named ...Backward accumulate (+=) into their
//     gradient arguments, so a buffer used twice (a tied embedding, a
//     residual) gets both gradients; callers Zero gradients before a
//     step. The optional arguments (a bias, a din, CrossEntropy's
//     weights, AdamW's decay) are the zero Buffer when absent.
//   - Ownership. Alloc's memory belongs to the backend; Free releases an
//     allocation (not a view), after which neither it nor its views may
//     be used. Workspace.Free, DrafterWork.Free and AdamW.Free release
//     theirs. The CPU backend's Free does nothing (the garbage collector
//     reclaims), so CPU code that forgets to free is correct; a device
//     backend leaks what is not freed. An all-reduce's Sum is dropped
//     after one round: a device backend should draw its accumulators
//     from a pool it reuses.
//   - Threads. A backend value may be shared by goroutines. Each replica
//     (a goroutine) uses its own workspaces and its own model copy, or
//     reads a shared model's weights only (several Workspaces may run
//     Forward on one Model at once); a device backend gives each replica
//     its own stream. Kernels may use several cores (or a whole device)
//     for one call. A group's Sum is added to by one member at a time.
//
// Invariants: a model's parameters are one flat buffer (Params) that its
// named tensors view (P); a view shared with another model (the drafter
// reads its target's embedding, and lives on its target's backend) is
// read-only to the borrower.
//
// Shapes: N rows of width D; a linear layer's weight is [Out, In] and its
// output is in @ W^T + b; attention reads qkv [B, T, 3C] (q, k, v
// concatenated per position) and writes [B, T, C].
package nn
