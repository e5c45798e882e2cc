#!/usr/bin/env python3
"""dflow-plugin-pystats: an example dflow plugin in Python.

Node kind "stats" (py/stats when the plugin block is named py): items of
any type pass through; hidden states (target_forward's items) are scaled
by the config's `scale` and their root mean square, before scaling, is
published as the metric `hidden_rms`; every item counts in `items`.
Node kind "zip": two inputs read in turn, a node that needs them
interleaved. Node kind "fork": `count` items on each of two outputs, sent
from two threads.
"""

import os
import sys
import time
import threading

import numpy as np

from dflowplugin import Blob, Field, Hidden, Node, Port, serve  # on PYTHONPATH: plugins/python (dflow-python puts it there)


class Stats(Node):
    name = "stats"
    doc = "passes items through; scales hidden states and publishes their RMS"
    config = [
        Field("scale", "number", default=1.0, doc="factor applied to hidden states"),
        Field("crash_after", "int", default=0, doc="exit abruptly after this many items (0: never)"),
        Field("sleep", "number", default=0, doc="seconds of work on each item, outside any recv or send"),
    ]

    def ports(self, config):
        return [Port("in", "any", doc="items of any type"),
                Port("out", output=True, same_as="in", doc="the same items")]

    def check(self, config):
        if not isinstance(config["scale"], (int, float)):
            return [("scale", "must be a number")]
        return []

    def run(self, r):
        scale, crash = float(r.config["scale"]), int(r.config["crash_after"])
        sleep = float(r.config["sleep"])
        n = 0
        for item in r.recv("in"):
            if sleep:
                time.sleep(sleep)
            if crash and n == crash:
                sys.stderr.write("stats: crashing on purpose after %d items\n" % n)
                sys.stderr.flush()
                os._exit(3)
            if getattr(item, "shared", False):
                r.metric("shared", 1, counter=True)  # it came by reference
            if isinstance(item, Hidden):
                r.metric("hidden_rms", float(np.sqrt(np.mean(np.square(item.hidden, dtype=np.float64)))))
                if scale != 1:
                    # Written straight into a buffer dflow gave (shared
                    # memory when there is some): sent with no copy. The
                    # received arrays may be read-only views of dflow's.
                    out = r.alloc_hidden(item.B, item.T, item.K, item.D, item.seq)
                    np.multiply(item.hidden, np.float32(scale), out=out.hidden)
                    out.tokens[...], out.greedy[...] = item.tokens, item.greedy
                    item = out
            r.send("out", item)
            n += 1
            r.metric("items", 1, counter=True)


class Zip(Node):
    name = "zip"
    doc = "takes items from inputs b and a in turn, b first, until both end"

    def ports(self, config):
        return [Port("a", "any"), Port("b", "any"), Port("out", output=True, same_as="a")]

    def run(self, r):
        inputs = [r.recv("b"), r.recv("a")]
        while inputs:
            for it in list(inputs):
                item = next(it, None)
                if item is None:
                    inputs.remove(it)
                else:
                    r.send("out", item)


class Fork(Node):
    name = "fork"
    doc = "sends count items on each of outputs a and b, from two threads"
    config = [Field("count", "int", default=0, doc="items per output")]

    def ports(self, config):
        return [Port("a", "blob", output=True), Port("b", "blob", output=True)]

    def run(self, r):
        def send(port):
            for i in range(int(r.config["count"])):
                r.send(port, Blob(r.index, i, port.encode()))

        threads = [threading.Thread(target=send, args=(port,)) for port in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


if __name__ == "__main__":
    serve(Stats(), Zip(), Fork())
