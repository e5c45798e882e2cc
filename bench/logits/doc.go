// Command logits runs dflow's target model on a fixed batch and writes
// its logits (float32, little-endian) to a file, for the parity check
// against the PyTorch reference (bench/torch_ref.py).
//
//	go run ./bench/logits -model models/target.safetensors -o /tmp/logits.bin
//
// It owns nothing else: bench/run runs it, then bench/torch_ref.py,
// which computes the reference logits and compares the two.
package main
