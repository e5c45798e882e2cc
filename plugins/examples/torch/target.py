#!/usr/bin/env python3
"""dflow-plugin-torch: dflow's target_forward, written in PyTorch, and
its drafter_train (drafter.py), served together.

Node kind "target_forward" (torch/target_forward): runs the byte-level
target LM of models/target.safetensors (the layout of internal/nn) on
token batches and emits the same hidden_states items as the Go
target_forward: the residual stream after each tapped block,
[B, T, K, D], the input tokens and the greedy next tokens [B, T]. The
hidden states are written straight into a buffer dflow gave
(alloc_hidden: shared memory), so they reach the Go drafters with one copy
out of the forward pass and none on the way.
"""

import json
import struct

import numpy as np

from dflowplugin import Field, Node, Port, serve  # on PYTHONPATH: plugins/python (dflow-python puts it there)

# torch is imported by a replica's process as its run begins (use_torch),
# not here: the plugin's first process, which dflow asks only what the kind
# is and whether a config is good (every dflow validate, every run's
# start), then starts in a tenth of the time (torch takes about a second
# of CPU to import).
torch = F = None


def use_torch():
    global torch, F
    if torch is None:
        import torch as t
        import torch.nn.functional as f
        torch, F = t, f


def read_header(path):
    """The safetensors header of path: tensors' entries and the config."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {})
    return header, json.loads(meta["config"]), 8 + n


def read_metadata(path):
    """The safetensors metadata of path (strings by key)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def load(path):
    header, config, start = read_header(path)
    with open(path, "rb") as f:
        data = f.read()
    params = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise ValueError("%s: tensor %s is %s, not F32" % (path, name, e["dtype"]))
        b, end = e["data_offsets"]
        params[name] = torch.from_numpy(np.frombuffer(data, "<f4", (end - b) // 4, start + b).copy()).view(e["shape"])
    return params, config


def default_taps(n, k=3):
    """internal/nn.DefaultTaps: k taps spread evenly, first block to last."""
    k = min(k, n)
    if k <= 1:
        return [n - 1]
    return [(i * (n - 1) + (k - 1) // 2) // (k - 1) for i in range(k)]


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def forward(p, c, tokens, taps):
    """Logits [B, T, vocab] and the residual streams after the tapped
    blocks, [B, T, K, D] (internal/nn/forward.go, block by block)."""
    B, T = tokens.shape
    D, H, NH = c["d_model"], c["hidden"], c["heads"]
    x = p["wte"][tokens] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    tapped = {}
    for l in range(c["layers"]):
        b = "blocks.%d." % l
        h = rmsnorm(x, p[b + "ln1.weight"])
        q, k, v = (h @ p[b + "attn.qkv.weight"].T).split(D, dim=-1)
        q, k, v = (t.view(B, T, NH, D // NH).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-1, -2)) / (D // NH) ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, D) @ p[b + "attn.proj.weight"].T
        h = rmsnorm(x, p[b + "ln2.weight"])
        gate, up = (h @ p[b + "mlp.fc.weight"].T).split(H, dim=-1)
        x = x + (F.silu(gate) * up) @ p[b + "mlp.proj.weight"].T
        tapped[l] = x
    logits = rmsnorm(x, p["ln_f.weight"]) @ p["wte"].T
    return logits, torch.stack([tapped[l] for l in taps], dim=2)


def hidden_type(d, taps):
    return "hidden_states(d=%d,layers=%s)" % (d, ",".join(str(l) for l in taps))


class TargetForward(Node):
    name = "target_forward"
    doc = ("Runs the frozen target LM in PyTorch on token batches; emits the hidden states of chosen "
           "layers and its greedy next tokens, as the Go target_forward does.")
    config = [
        Field("model", "string", required=True, doc="the target model (safetensors, from lm_train)"),
        Field("layers", "list(number)", doc="block indices to tap (0-based); default: 3 spread evenly from first to last"),
        Field("threads", "int", default=0, doc="torch threads (0: PyTorch's default)"),
    ]

    def taps(self, config, c):
        return [int(l) for l in config.get("layers") or []] or default_taps(c["layers"])

    # ports and check take any config, a model's missing too: dflow asks
    # for the ports of the default config, which sets no model, to list
    # them (dflow plugins, dflow nodes), and the SDK says "required".
    def ports(self, config):
        t = "hidden_states"
        try:
            _, c, _ = read_header(config["model"])
            t = hidden_type(c["d_model"], self.taps(config, c))
        except Exception:
            pass  # the type without the model's width: it is not known yet
        return [Port("in", "tokens", doc="token batches"), Port("hidden", t, output=True, doc="hidden states")]

    def check(self, config):
        if "model" not in config:
            return []  # the SDK reports it required
        try:
            _, c, _ = read_header(config["model"])
        except Exception as e:
            return [("model", "reading %s: %s" % (config["model"], e))]
        for l in config.get("layers") or []:
            if l != int(l) or not 0 <= l < c["layers"]:
                return [("layers", "layer %g is not a block of the %d-layer target" % (l, c["layers"]))]
        return []

    def run(self, r):
        use_torch()
        if r.config["threads"]:
            torch.set_num_threads(int(r.config["threads"]))
        # The replica's device: "cpu", or "cuda:N" as its process numbers
        # its GPUs (dflow binds the stage's devices before it starts).
        device = torch.device(r.device)
        p, c = load(r.config["model"])
        p = {k: v.to(device) for k, v in p.items()}
        taps = self.taps(r.config, c)
        K, D = len(taps), c["d_model"]
        with torch.no_grad():
            for batch in r.recv("in"):
                B, T = batch.B, batch.T
                inputs = torch.from_numpy(np.ascontiguousarray(batch.tokens[:, :T], np.int64)).to(device)
                logits, hidden = forward(p, c, inputs, taps)
                out = r.alloc_hidden(B, T, K, D, batch.seq)
                torch.from_numpy(out.hidden).copy_(hidden)  # the one copy: into dflow's buffer (from the device)
                out.tokens[...] = batch.tokens[:, :T]
                out.greedy[...] = logits.argmax(-1).cpu().numpy()
                r.send("hidden", out)


if __name__ == "__main__":
    from drafter import DrafterTrain  # drafter.py, beside this file

    serve(TargetForward(), DrafterTrain())
