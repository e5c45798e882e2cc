"""A group kind for the tests: a model trained with PyTorch's
DistributedDataParallel (gloo), one rank per replica, initialised from
the environment dflow gives a rank (init_method="env://"), on the items
of its input (synthetic_source blobs: x and y from the item's seq).

lockstep = true takes the input as steps (Replica.steps): every rank runs
the same number of steps, a rank with no item left a step of zero weight.
lockstep = false is the naive loop over recv: a rank that has run out
stops joining the all-reduce, and waits at the barrier before its save
while the others wait in their step's all-reduce.

Each rank says saves to dflow's group at its start, rank 0 saved every
second step, and each finish at its end. Each rank writes
OUT/rank-RANK.json at its end (its environment, items trained, their sum
over the group, its parameters, whether finish said it was the last) and
appends a line to OUT/trained-RANK as it begins each item's step (and,
in the naive loop, "barrier" as it has run out).

timeout_s is gloo's timeout (the rendezvous, each collective): the tests
set one shorter than their deadline, so that a rank whose peer never
comes fails with torch's message rather than waiting. watchdog_at (Unix
seconds, 0: none) is a test's last resort against a hang that no timeout
ends (a rank blocked reading a connection that never answers): at that
time the rank writes every thread's Python stack on stderr and exits."""

import datetime
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflowplugin import Field, Node, Port, serve

ENV = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
       "CUDA_VISIBLE_DEVICES", "DFLOW_DEVICE"]


def batch(items):
    seq = torch.tensor([float(it.seq) for it in items]).unsqueeze(1)
    x = torch.cat([seq / 7, torch.ones_like(seq), (seq % 3) / 3, -seq / 5], dim=1)
    return x, 0.5 * seq / 7


class Train(Node):
    name = "ddp"
    doc = "Trains a linear model with DDP (gloo) on its input's items."
    group = True
    config = [
        Field("out", "string", required=True, doc="folder for each rank's report"),
        Field("k", "int", default=1, doc="items a step"),
        Field("lockstep", "bool", default=True, doc="steps in lockstep (Replica.steps); false: the naive loop"),
        Field("timeout_s", "int", default=600, doc="gloo's timeout for a collective"),
        Field("crash_at", "int", default=-1, doc="rank 1's process exits at this step"),
        Field("watchdog_at", "int", default=0,
              doc="Unix time at which the rank writes its threads' stacks on stderr and exits (0: never)"),
    ]

    def ports(self, config):
        return [Port("in", "blob")]

    def run(self, r):
        c = r.config
        env = {k: os.environ[k] for k in ENV if k in os.environ}
        if c["watchdog_at"] > 0:
            faulthandler.dump_traceback_later(max(c["watchdog_at"] - time.time(), 1), exit=True)
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=c["timeout_s"]))
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log = open(os.path.join(c["out"], "trained-%d" % rank), "w")
        trained = 0
        r.saves()  # dflow's group: the inputs are settled at the saves

        def step(items, scale):
            x, y = batch(items) if items else (torch.zeros(1, 4), torch.zeros(1, 1))
            loss = ((model(x) - y) ** 2).sum() * scale
            opt.zero_grad()
            loss.backward()  # DDP's all-reduce of the gradients
            opt.step()

        if c["lockstep"]:
            for s in r.steps("in", c["k"]):
                if rank == 1 and s.index == c["crash_at"]:
                    sys.stderr.write("ddp: rank 1 dying on purpose at step %d\n" % s.index)
                    sys.stderr.flush()
                    os._exit(3)
                log.write("step %d: %d items\n" % (s.index, len(s.items)))
                log.flush()
                # The mean over the step's items of every rank: DDP averages
                # over the ranks, so each scales its sum by world / total; a
                # rank without items takes part with a weight of zero.
                step(s.items, world / s.total if s.items else 0.0)
                trained += len(s.items)
                if rank == 0 and s.index % 2 == 1:
                    r.saved(s.index)  # as if a checkpoint of this step were written
        else:
            for item in r.recv("in"):
                log.write("item %d\n" % item.seq)
                log.flush()
                step([item], 1.0)
                trained += 1
            log.write("barrier\n")
            log.flush()
            dist.barrier()  # as a trainer does before it saves
        count = torch.tensor([float(trained)])
        dist.all_reduce(count)
        params = [p.detach().reshape(-1).tolist() for p in model.module.parameters()]
        last = r.finish()
        with open(os.path.join(c["out"], "rank-%d.json" % rank), "w") as f:
            json.dump({"rank": rank, "env": env, "device": r.device, "group": r.group,
                       "trained": trained, "sum": count.item(), "params": params, "last": last}, f)
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


serve(Train())
