// Package torch is an example plugin in PyTorch: target_forward, the
// target LM of models/target.safetensors run by PyTorch (target.py, on
// the Python module of plugins/python), emitting the same
// hidden_states items as the Go target_forward. Its test checks parity
// with the Go target and runs specs/dflash.hcl with it; README.md is the
// walkthrough.
package torch
