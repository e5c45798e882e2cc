"""dflow-plugin-torch's drafter_train: dflow's block drafter, written in
PyTorch and trained with DistributedDataParallel.

Node kind "drafter_train" (torch/drafter_train) is a group kind: its
replicas are the ranks of one DDP job (gloo on the CPU, NCCL on CUDA
devices, gloo where the ranks share one), each started by dflow with
torchrun's environment. It trains the DFlash-style block drafter of
internal/nn (internal/nn/drafter.go,
the same tensors, shapes and initialization) on the hidden_states items
of the Go or the PyTorch target_forward, taking them in lockstep
(Replica.steps, one batch a rank a step), and saves checkpoints with the
Go drafter's safetensors layout and metadata (format dflow-drafter, its
config, step, batches, target and its SHA-256, AdamW's moments), so that
dflow eval measures it with the Go code.

The drafter, from an anchor: the target's tapped hidden states at the
anchor's position, fused (a linear layer, then RMSNorm), are added to the
residual stream entering every drafter block; the block's input is
[anchor, MASK x (block_size-1)] embedded with the target's frozen
embedding plus a learned position; the blocks are the target's (RMSNorm,
attention, here not causal, SwiGLU); the head is the target's embedding,
frozen. The loss weighs drafted position j by exp(-(j-1)/gamma).
"""

import datetime
import hashlib
import json
import math
import os
import secrets
import sys
import struct
import time

import numpy as np

import target as tgt  # the target's file format and taps (target.py, beside this file)
from dflowplugin import Field, Node, Port

FORMAT = "dflow-drafter"  # internal/nn.DrafterFormat

torch = dist = F = DDP = None


def use_torch():
    """Imports torch as a replica's run begins (target.py says why)."""
    global torch, dist, F, DDP
    if torch is None:
        tgt.use_torch()
        import torch as t
        import torch.distributed as d
        import torch.nn.functional as f
        from torch.nn.parallel import DistributedDataParallel as ddp
        torch, dist, F, DDP = t, d, f, ddp


def layout(c):
    """The drafter's tensors, in the order of internal/nn's layout: names
    and shapes (c: the checkpoint's config)."""
    D, H = c["d_model"], c["hidden"]
    out = [("fuse.weight", [D, c["target_layers"] * D]), ("fuse_norm.weight", [D]), ("mask", [D]),
           ("wpe", [c["block_size"], D])]
    for l in range(c["layers"]):
        b = "blocks.%d." % l
        out += [(b + "ln1.weight", [D]), (b + "attn.qkv.weight", [3 * D, D]), (b + "attn.proj.weight", [D, D]),
                (b + "ln2.weight", [D]), (b + "mlp.fc.weight", [2 * H, D]), (b + "mlp.proj.weight", [D, H])]
    out.append(("ln_f.weight", [D]))
    return out


def numel(shape):
    return int(np.prod(shape)) if shape else 1


def config_json(c):
    """The config as the Go drafter's metadata holds it (nn.DrafterConfig
    marshalled: its fields in order, no spaces)."""
    keys = ["d_model", "target_layers", "taps", "layers", "heads", "hidden", "block_size"]
    return json.dumps({k: c[k] for k in keys}, separators=(",", ":"))


def write_safetensors(path, tensors, metadata):
    """tensors: (name, shape, float32 numpy array) in order, written as
    internal/nn.WriteSafetensors writes them (the header's keys sorted,
    padded with spaces to 8 bytes; through a .tmp file renamed over)."""
    header, off = {"__metadata__": metadata}, 0
    for name, shape, a in tensors:
        n = 4 * a.size
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps({k: header[k] for k in sorted(header)}, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, a in tensors:
            f.write(np.ascontiguousarray(a, "<f4").tobytes())
    os.replace(tmp, path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def backend_for(device, asked):
    """The torch.distributed backend: asked, if set; gloo on the CPU; on
    CUDA, NCCL where each of this host's ranks has a device of its own
    (dflow then shows every rank all of them: CUDA_VISIBLE_DEVICES has
    LOCAL_WORLD_SIZE entries), gloo where the ranks share one (NCCL
    refuses two ranks on one device; gloo all-reduces CUDA tensors through
    the host)."""
    if asked:
        return asked
    if device.type != "cuda":
        return "gloo"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return "nccl" if local == 1 or len(visible) >= local else "gloo"


class BlockDrafter:
    """The drafter's parameters as one flat tensor (as internal/nn keeps
    them: Params, the named tensors its views), its forward pass and loss.
    make_module wraps it for DDP."""

    def __init__(self, c, wte, seed, device):
        self.c, self.wte = c, wte
        self.names = layout(c)
        self.offs, n = [], 0
        for _, s in self.names:
            self.offs.append(n)
            n += numel(s)
        # internal/nn.NewDrafter's initialization: norms' weights 1, the
        # mask and the matrices normal with std 0.02, fuse.weight
        # 1/sqrt(K*D); the same on every rank (the seed), and DDP
        # broadcasts rank 0's at its start anyway.
        g = torch.Generator().manual_seed(seed)
        init = torch.empty(n)
        decay = torch.zeros(n)
        for (name, s), o in zip(self.names, self.offs):
            v = init[o:o + numel(s)]
            if len(s) == 1 and name != "mask":
                v.fill_(1)
                continue
            std = 1 / math.sqrt(c["target_layers"] * c["d_model"]) if name == "fuse.weight" else 0.02
            v.normal_(0, std, generator=g)
            if len(s) == 2:
                decay[o:o + numel(s)] = 1  # AdamW decays matrices only (Drafter.DecayMask)
        self.flat = torch.nn.Parameter(init.to(device))
        self.decay = decay.to(device)

    def load(self, path):
        """Sets the parameters to a checkpoint's (a drafter's safetensors
        file, as internal/nn.LoadDrafter reads it)."""
        params, _ = tgt.load(path)
        with torch.no_grad():
            for i, (name, s) in enumerate(self.names):
                self.tensor(i).copy_(params[name].view(s))

    def tensor(self, i):
        name, s = self.names[i]
        return self.flat[self.offs[i]:self.offs[i] + numel(s)].view(s)

    def views(self):
        return {name: self.tensor(i) for i, (name, _) in enumerate(self.names)}

    def logits(self, ctx_in, anchors):
        """Logits [S, P, 256] for S samples: ctx_in [S, K*D], the target's
        tapped hidden states at each anchor's position; anchors [S]."""
        p, c = self.views(), self.c
        S, P, D, H, NH = ctx_in.shape[0], c["block_size"], c["d_model"], c["hidden"], c["heads"]
        ctx = rmsnorm(ctx_in @ p["fuse.weight"].T, p["fuse_norm.weight"])
        x = torch.cat([self.wte[anchors].unsqueeze(1), p["mask"].expand(S, P - 1, D)], 1) + p["wpe"]
        for l in range(c["layers"]):
            b = "blocks.%d." % l
            x = x + ctx.unsqueeze(1)  # the fused target context enters every block
            h = rmsnorm(x, p[b + "ln1.weight"])
            q, k, v = (h @ p[b + "attn.qkv.weight"].T).split(D, dim=-1)
            q, k, v = (t.view(S, P, NH, D // NH).transpose(1, 2) for t in (q, k, v))
            att = ((q @ k.transpose(-1, -2)) / (D // NH) ** 0.5).softmax(-1)  # not causal
            x = x + (att @ v).transpose(1, 2).reshape(S, P, D) @ p[b + "attn.proj.weight"].T
            h = rmsnorm(x, p[b + "ln2.weight"])
            gate, up = (h @ p[b + "mlp.fc.weight"].T).split(H, dim=-1)
            x = x + (F.silu(gate) * up) @ p[b + "mlp.proj.weight"].T
        return rmsnorm(x, p["ln_f.weight"]) @ self.wte.T

    def loss(self, ctx_in, anchors, labels, gamma):
        """The weighted cross-entropy of the drafted positions against
        labels [S, P-1]: position j weighs exp(-(j-1)/gamma)."""
        logits = self.logits(ctx_in, anchors)[:, 1:]
        P1 = labels.shape[1]
        w = torch.exp(-torch.arange(P1, dtype=logits.dtype, device=logits.device) / gamma).expand(labels.shape)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        return (ce * w.reshape(-1)).sum() / w.sum()


def make_module(drafter):
    """A torch Module holding the drafter's one parameter, for DDP."""

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.flat = drafter.flat

        def forward(self, ctx_in, anchors, labels, gamma):
            return drafter.loss(ctx_in, anchors, labels, gamma)

    return Module()


class AdamW:
    """internal/nn.AdamW over the flat parameter: betas 0.9 and 0.95, eps
    1e-8, decoupled weight decay where decay is 1, the gradient clipped to
    a global norm of 1."""

    def __init__(self, flat, decay, weight_decay):
        self.m, self.v, self.t = torch.zeros_like(flat), torch.zeros_like(flat), 0
        self.decay, self.wd = decay, weight_decay
        self.b1, self.b2, self.eps, self.clip = 0.9, 0.95, 1e-8, 1.0

    def step(self, p, g, lr):
        """Updates p from its gradient g at learning rate lr; returns the
        gradient's norm before clipping."""
        with torch.no_grad():
            norm = float(g.norm())
            if norm > self.clip:
                g = g * (self.clip / norm)
            self.t += 1
            self.m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            self.v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            mh = self.m / (1 - self.b1 ** self.t)
            vh = self.v / (1 - self.b2 ** self.t)
            p.sub_(lr * (mh / (vh.sqrt() + self.eps) + self.wd * self.decay * p))
        return norm


class DrafterTrain(Node):
    name = "drafter_train"
    doc = ("Trains dflow's DFlash-style block drafter in PyTorch on a target's hidden states; its replicas are "
           "the ranks of one DDP job (gloo on the CPU, NCCL on CUDA devices), and its checkpoints are the Go drafter_train's.")
    group = True
    restores = True  # lost with a worker, the group restarts whole from its last checkpoint
    config = [
        Field("target", "string", default="models/target.safetensors", path="read",
              doc="the target model whose embedding and head the drafter reuses (frozen)"),
        Field("target_layers", "int", default=3, doc="how many target layers the hidden states carry, spaced evenly"),
        Field("taps", "list(number)", doc="the target blocks the hidden states come from; overrides target_layers"),
        Field("block_size", "int", default=4, doc="tokens per block: the anchor and block_size-1 drafted"),
        Field("layers", "int", default=1, doc="drafter blocks"),
        Field("heads", "int", default=4, doc="attention heads"),
        Field("hidden", "int", default=256, doc="SwiGLU width"),
        Field("anchors", "int", default=16, doc="anchor positions sampled per sequence"),
        Field("gamma", "number", default=4.0, doc="loss weight of drafted position k is exp(-(k-1)/gamma)"),
        Field("lr", "number", default=3e-3, doc="peak learning rate"),
        Field("warmup", "int", default=20, doc="steps of linear warmup"),
        Field("weight_decay", "number", default=0.01, doc="AdamW weight decay on matrices"),
        Field("checkpoint", "string", default="", path="write",
              doc="safetensors file to save to (every checkpoint_every steps and at the end); \"\": none"),
        Field("checkpoint_every", "int", default=100, doc="steps between checkpoints"),
        Field("overwrite", "bool", default=False, doc="replace the checkpoint file when it exists (otherwise the ranks fail as they start, naming the file)"),
        Field("seed", "int", default=1, doc="the drafter's init and sampling seed"),
        Field("threads", "int", default=0, doc="torch threads per rank (0: PyTorch's default)"),
        Field("backend", "string", default="",
              doc="torch.distributed's backend: \"\" for gloo on the CPU and NCCL on CUDA (gloo where ranks share a device), or \"gloo\", \"nccl\""),
    ]

    def drafter_config(self, config):
        _, c, _ = tgt.read_header(config["target"])
        taps = [int(t) for t in config.get("taps") or []] or tgt.default_taps(c["layers"], config["target_layers"])
        return {"d_model": c["d_model"], "target_layers": len(taps), "taps": taps, "layers": config["layers"],
                "heads": config["heads"], "hidden": config["hidden"], "block_size": config["block_size"]}

    def ports(self, config):
        t = "hidden_states"
        try:
            dc = self.drafter_config(config)
            t = tgt.hidden_type(dc["d_model"], dc["taps"])
        except Exception:
            pass  # without the target's width and taps: not known yet
        return [Port("hidden", t, doc="hidden states from target_forward (Go or PyTorch)")]

    def check(self, config):
        errors = []
        try:
            _, c, _ = tgt.read_header(config["target"])
        except Exception as e:
            return [("target", "reading %s: %s" % (config["target"], e))]
        for f in ("target_layers", "layers", "heads", "hidden", "anchors", "checkpoint_every"):
            if config[f] < 1:
                errors.append((f, "must be at least 1"))
        if config["backend"] not in ("", "gloo", "nccl"):
            errors.append(("backend", "%r is not \"\", \"gloo\" or \"nccl\"" % config["backend"]))
        if config["block_size"] < 2:
            errors.append(("block_size", "must be at least 2 (an anchor and one drafted token)"))
        if config["heads"] >= 1 and c["d_model"] % config["heads"]:
            errors.append(("heads", "%d heads do not divide the target's width %d" % (config["heads"], c["d_model"])))
        for t in config.get("taps") or []:
            if t != int(t) or not 0 <= t < c["layers"]:
                errors.append(("taps", "block %g is not a block of the %d-block target" % (t, c["layers"])))
        return errors

    def run(self, r):
        use_torch()
        cfg = r.config
        if cfg["threads"]:
            torch.set_num_threads(int(cfg["threads"]))
        path = cfg["checkpoint"]
        restoring = r.restore_step is not None  # a restart of the group lost whole (Node.restores)
        if path and os.path.exists(path) and not cfg["overwrite"] and not restoring:
            raise RuntimeError("drafter_train: %s already exists; refusing to overwrite it. Set overwrite = true to replace it "
                               "(--set stage.%s.config.overwrite=true), or write elsewhere with checkpoint = \"FILE\"."
                               % (path, r.stage))
        cuda = r.device.startswith("cuda")
        device = torch.device(r.device)
        if cuda:
            torch.cuda.set_device(device)
        backend = backend_for(device, cfg["backend"])
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(minutes=30))
        rank, world = dist.get_rank(), dist.get_world_size()
        # The run's id for the checkpoint's metadata, rank 0's for all.
        run = [{"run_id": secrets.token_hex(8),
                "run_started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}]
        dist.broadcast_object_list(run, src=0)
        params, _ = tgt.load(cfg["target"])
        dc = self.drafter_config(cfg)
        wte = params["wte"].to(device)
        drafter = BlockDrafter(dc, wte, cfg["seed"], device)
        model = DDP(make_module(drafter), device_ids=[device.index] if cuda else None)
        opt = AdamW(drafter.flat, drafter.decay, cfg["weight_decay"])
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000003 + rank)
        P, A, K, D = dc["block_size"], cfg["anchors"], dc["target_layers"], dc["d_model"]
        target_abs, target_hash = os.path.abspath(cfg["target"]), sha256(cfg["target"])

        step = batches = 0
        if path and not restoring and rank == 0:
            try:
                os.remove(path + ".prev")  # an earlier run's: not a save of this one
            except FileNotFoundError:
                pass
        if restoring and r.restore_step >= 0:
            # the group's last save, which SAVED named: the weights, the
            # optimizer's moments and count, the step and the batches it
            # had trained; what came after it comes back
            if not path or not os.path.exists(path):
                raise RuntimeError("drafter_train: told to restore the save of step %d, but the checkpoint %r is not there"
                                   % (r.restore_step, path))
            # the save dflow holds is the checkpoint's, or, where the group
            # was lost between writing a newer one and saying it, the one
            # before (kept beside it as PATH.prev)
            found = [f for f in (path, path + ".prev")
                     if os.path.exists(f) and int(tgt.read_metadata(f).get("step", -1)) == r.restore_step]
            if not found:
                raise RuntimeError("drafter_train: told to restore the save of step %d, but neither %s nor %s.prev holds it "
                                   "(written since by another run?)" % (r.restore_step, path, path))
            saved, _ = tgt.load(found[0])
            meta = tgt.read_metadata(found[0])
            with torch.no_grad():
                for i, (name, sh) in enumerate(drafter.names):
                    drafter.tensor(i).copy_(saved[name].view(sh).to(device))
                opt.m.copy_(saved["opt.m"].view(-1).to(device))
                opt.v.copy_(saved["opt.v"].view(-1).to(device))
            opt.t = int(meta["opt.t"])
            step, batches = int(meta["step"]), int(meta["batches"])
            run[0] = {"run_id": meta.get("run_id", run[0]["run_id"]), "run_started": meta.get("run_started", run[0]["run_started"])}
            if rank == 0:
                print("drafter_train: restored the group's save of step %d (%d batches) from %s" % (step, batches, path),
                      file=sys.stderr, flush=True)
        elif restoring:
            if rank == 0:
                print("drafter_train: the group restarts afresh: it had saved nothing yet", file=sys.stderr, flush=True)

        def save():
            flat = drafter.flat.detach().cpu().numpy()
            ts = [(name, s, flat[o:o + numel(s)]) for (name, s), o in zip(drafter.names, drafter.offs)]
            n = flat.size
            ts += [("opt.m", [n], opt.m.cpu().numpy()), ("opt.v", [n], opt.v.cpu().numpy())]
            meta = dict(run[0], config=config_json(dc), format=FORMAT, step=str(step), batches=str(batches),
                        target=target_abs, target_sha256=target_hash)
            meta["opt.t"] = str(opt.t)
            if os.path.exists(path) and r.group and getattr(self, "restores", False):
                # the save before stays until dflow holds this one (saved):
                # lost in between, the group restores that one
                os.replace(path, path + ".prev")
            write_safetensors(path, ts, meta)

        every = cfg["checkpoint_every"]
        if path:
            r.saves()  # dflow settles the inputs at the saves (on a cluster)
        began = time.monotonic()
        for s in r.steps("hidden", 1):
            if s.items:
                h = s.items[0]
                if h.K != K or h.D != D:
                    raise ValueError("drafter_train: hidden states of width %d x %d layers, the drafter expects %d x %d" % (h.D, h.K, D, K))
                if h.T < P + 1:
                    raise ValueError("drafter_train: sequences of %d tokens are too short for blocks of %d" % (h.T, P))
                # A anchors a sequence (as the Go drafter samples them):
                # the hidden states at position a, the anchor token at
                # a+1, the target's greedy tokens after it as the labels.
                a = torch.randint(0, h.T - P, (h.B, A), generator=gen).numpy()
                b = np.arange(h.B)[:, None]
                ctx_in = torch.from_numpy(np.ascontiguousarray(h.hidden[b, a].reshape(h.B * A, K * D)))
                anchors = torch.from_numpy(h.tokens[b, a + 1].reshape(-1).astype(np.int64))
                labels = torch.from_numpy(np.stack([h.greedy[b, a + 1 + j] for j in range(P - 1)], -1)
                                          .reshape(-1, P - 1).astype(np.int64))
                # DDP averages over the ranks: the mean over the step's batches
                scale = world / s.total
            else:  # this rank has run out while others have not: a zero weight
                ctx_in, anchors = torch.zeros(1, K * D), torch.zeros(1, dtype=torch.int64)
                labels, scale = torch.zeros(1, P - 1, dtype=torch.int64), 0.0
            ctx_in, anchors, labels = ctx_in.to(device), anchors.to(device), labels.to(device)
            loss = model(ctx_in, anchors, labels, cfg["gamma"])
            drafter.flat.grad = None
            (loss * scale).backward()  # DDP's all-reduce of the gradient: every rank, every step
            lr = cfg["lr"] * min(1.0, (step + 1) / max(cfg["warmup"], 1))
            opt.step(drafter.flat.data, drafter.flat.grad, lr)
            step += 1
            batches += s.total
            if s.items:
                r.metric("loss", float(loss))
            r.metric("step", step)
            r.metric("batches", batches)
            if rank == 0:
                r.metric("batches_per_s", batches / (time.monotonic() - began))
                if path and step % every == 0:
                    save()
                    r.saved(step)
        # DDP keeps the ranks' parameters identical: rank_divergence says
        # by how much they differ at the end (0: not at all).
        flat = drafter.flat.detach()
        if backend != "nccl":
            flat = flat.cpu()  # gloo gathers host tensors
        every_rank = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every_rank, flat)
        r.metric("rank_divergence", max(float((p - every_rank[0]).abs().max()) for p in every_rank))
        # Every rank ended after the same step with the same weights: the
        # group's last member writes the final checkpoint.
        if r.finish() and path:
            save()
        dist.destroy_process_group()
