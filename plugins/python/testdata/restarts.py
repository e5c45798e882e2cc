"""A group kind that restores, for the tests of a group that restarts
whole in one process: three DDP ranks (gloo) train a linear model on the
items of their input (synthetic_source blobs), in lockstep steps, and
count how many times the group trained each item (by its seq), with
torch.distributed's all_reduce of a vector holding a 1 at each of the
rank's items.

Rank 0 saves every `every` steps: the model, the optimizer, the step and
the counts to OUT/ckpt-STEP.pt (written whole, then renamed), then says
r.saved(step). A rank told to restore (r.restore_step >= 0) loads that
save. The group's last member (r.finish()) writes OUT/final.json: the
step and the counts. Each rank appends its start to OUT/starts-RANK
("restore=STEP port=MASTER_PORT"; STEP none on a first start). On its
first start (on every start with pause_always), rank 1 at step pause_at
writes its pid to OUT/paused-1, says so on stderr and waits to be
killed: the others wait in the step's all-reduce."""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflowplugin import Field, Node, Port, serve


def batch(items):
    seq = torch.tensor([float(it.seq) for it in items]).unsqueeze(1)
    x = torch.cat([seq / 7, torch.ones_like(seq), (seq % 3) / 3, -seq / 5], dim=1)
    return x, 0.5 * seq / 7


def write(path, data, save):
    tmp = path + ".tmp"
    save(data, tmp)
    os.replace(tmp, path)


class Train(Node):
    name = "restarts"
    doc = "Trains with DDP (gloo), saves every few steps and restores the save it is told."
    group = True
    restores = True
    config = [
        Field("out", "string", required=True, doc="folder for the saves and the starts"),
        Field("items", "int", required=True, doc="items in all (their seqs count)"),
        Field("every", "int", default=3, doc="rank 0 saves every so many steps"),
        Field("pause_at", "int", default=-1, doc="rank 1 waits to be killed at this step"),
        Field("pause_always", "bool", default=False, doc="on every start, not the first only"),
        Field("timeout_s", "int", default=120, doc="gloo's timeout for a collective"),
    ]

    def ports(self, config):
        return [Port("in", "blob")]

    def run(self, r):
        c = r.config
        out = c["out"]
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=c["timeout_s"]))
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step, counts = 0, torch.zeros(c["items"])
        if r.restore_step is not None and r.restore_step >= 0:
            ck = torch.load(os.path.join(out, "ckpt-%d.pt" % r.restore_step))
            model.module.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            step, counts = ck["step"], ck["counts"]
        with open(os.path.join(out, "starts-%d" % rank), "a") as f:
            f.write("restore=%s port=%s\n" % ("none" if r.restore_step is None else r.restore_step, os.environ["MASTER_PORT"]))
        r.saves()
        for s in r.steps("in", 1):
            if rank == 1 and s.index == c["pause_at"] and (r.restore_step is None or c["pause_always"]):
                write(os.path.join(out, "paused-1"), str(os.getpid()), lambda d, p: open(p, "w").write(d))
                sys.stderr.write("restarts: rank 1 waits to be killed at step %d\n" % s.index)
                sys.stderr.flush()
                while True:
                    time.sleep(1)
            x, y = batch(s.items) if s.items else (torch.zeros(1, 4), torch.zeros(1, 1))
            loss = ((model(x) - y) ** 2).sum() * (world / s.total if s.items else 0.0)
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce of the gradients
            opt.step()
            seen = torch.zeros(c["items"])
            for it in s.items:
                seen[it.seq] += 1
            dist.all_reduce(seen)
            counts += seen
            step += 1
            if rank == 0 and step % c["every"] == 0:
                write(os.path.join(out, "ckpt-%d.pt" % step),
                      {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step, "counts": counts},
                      torch.save)
                r.saved(step)
        if r.finish():
            write(os.path.join(out, "final.json"), {"step": step, "counts": counts.tolist()},
                  lambda d, p: json.dump(d, open(p, "w")))
        dist.destroy_process_group()


serve(Train())
