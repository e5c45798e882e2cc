// Package torch is an example plugin in PyTorch: target_forward, the
// target LM of models/target.safetensors run by PyTorch (target.py, on
// the Python module of plugins/python), emitting the same
// hidden_states items as the Go target_forward, and drafter_train
// (drafter.py), the Go block drafter in PyTorch, a group kind whose
// replicas are DDP ranks, saving checkpoints in the Go drafter's layout.
// Its tests check parity with the Go target and drafter and run
// specs/dflash.hcl with the PyTorch target and specs/dflash-torch.hcl
// with both; README.md is the walkthrough.
package torch
