// Command logits runs dflow's target model on a fixed batch and writes
// its logits (float32, little-endian) to a file, for the parity check
// against the PyTorch reference (bench/torch_ref.py).
//
//	go run ./bench/logits -model models/target.safetensors -o /tmp/logits.bin
//
// With -train N it then runs N training steps of the target (AdamW) on
// that batch, and N of a drafter on the trained target's hidden states,
// and prints each one's final loss and a hash of its weights, bit for
// bit: with the logits file, the record that a change to the kernels or
// the backend left inference and training unchanged.
//
//	go run ./bench/logits -o /tmp/logits.bin -train 5
//
// It owns nothing else: bench/run runs it, then bench/torch_ref.py,
// which computes the reference logits and compares the two.
package main
