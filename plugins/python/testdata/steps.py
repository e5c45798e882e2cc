"""A group kind for the tests, without torch: each rank takes its input
as steps of k items (Replica.steps) and writes OUT/rank-RANK.json at its
end: the steps it took (index, items, total, members), the seqs of its
items, and a sum all-reduced through dflow's group. compute_ms stands for
a step's compute: the rank sleeps that long on each step."""

import json
import os
import time

from dflowplugin import Field, Node, Port, serve


class Steps(Node):
    name = "steps"
    doc = "Takes its input in steps and says what each step held."
    group = True
    config = [Field("out", "string", required=True), Field("k", "int", default=1),
              Field("compute_ms", "int", default=0, doc="milliseconds each step computes (sleeps)")]

    def ports(self, config):
        return [Port("in", "blob")]

    def run(self, r):
        steps, seqs = [], []
        for s in r.steps("in", r.config["k"]):
            steps.append([s.index, len(s.items), s.total, s.members])
            seqs += [it.seq for it in s.items]
            time.sleep(r.config["compute_ms"] / 1000)
        (seq_sum,), members = r.all_reduce([sum(seqs)])
        with open(os.path.join(r.config["out"], "rank-%d.json" % r.index), "w") as f:
            json.dump({"steps": steps, "seqs": seqs, "seq_sum": seq_sum, "members": members,
                       "rank": os.environ.get("RANK"), "last": r.finish()}, f)


serve(Steps())
