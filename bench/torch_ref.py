#!/usr/bin/python3
"""PyTorch reference of dflow's byte-level target LM (internal/nn).

Loads the same safetensors weights, checks logits against dflow's
(bench/logits writes them) and times forward and training steps with the
same batch and thread count. Run with Debian's system Python, which has
Debian's python3-torch (and libopenblas0-pthread for a fair BLAS):

    /usr/bin/python3 bench/torch_ref.py models/target.safetensors /tmp/logits.bin
"""
import json
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", name
        b, end = e["data_offsets"]
        arr = np.frombuffer(body[b:end], dtype="<f4").reshape(e["shape"])
        tensors[name] = torch.tensor(arr.copy())
    return tensors, json.loads(meta["config"])


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def forward(p, c, tokens):
    B, T = tokens.shape
    D, H, NH = c["d_model"], c["hidden"], c["heads"]
    x = p["wte"][tokens] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(c["layers"]):
        b = f"blocks.{l}."
        h = rmsnorm(x, p[b + "ln1.weight"])
        qkv = h @ p[b + "attn.qkv.weight"].T
        q, k, v = qkv.split(D, dim=-1)
        q, k, v = (t.view(B, T, NH, D // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (D // NH) ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + y @ p[b + "attn.proj.weight"].T
        h = rmsnorm(x, p[b + "ln2.weight"])
        gate, up = (h @ p[b + "mlp.fc.weight"].T).split(H, dim=-1)
        x = x + (F.silu(gate) * up) @ p[b + "mlp.proj.weight"].T
    return rmsnorm(x, p["ln_f.weight"]) @ p["wte"].T


def main():
    model, logits_path = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    torch.set_num_threads(threads)
    p, c = load_safetensors(model)
    B, T = 8, 128
    tokens = torch.tensor([(i * 31 + 7) % 256 for i in range(B * T)]).view(B, T)
    with torch.no_grad():
        ref = forward(p, c, tokens).reshape(-1).numpy()
    ours = np.fromfile(logits_path, dtype="<f4")
    diff = float(np.abs(ref - ours).max())
    print(f"parity: max |logit difference| {diff:.2e} over {ours.size} logits ({'ok' if diff < 1e-4 else 'MISMATCH'})")

    with torch.no_grad():
        forward(p, c, tokens)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 3:
            forward(p, c, tokens)
            n += 1
    fwd = n * B * T / (time.perf_counter() - start)
    params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    targets = torch.roll(tokens, -1, dims=1)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 5:
        loss = F.cross_entropy(forward(params, c, tokens).view(-1, c["vocab"]), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        n += 1
    train = n * B * T / (time.perf_counter() - start)
    print(f"torch {torch.__version__} ({threads} threads): forward {fwd:.0f} tokens/s, train step {train:.0f} tokens/s")


if __name__ == "__main__":
    main()
