"""dflow plugins in Python.

A plugin is an executable that speaks the dflow.plugin.v1 Node service
(plugins/proto/dflow.proto) over hashicorp/go-plugin's gRPC transport:
dflow starts it, reads one handshake line from its stdout, and connects.
This package is that transport, the Node service and the item codec, so
that a plugin is a few node classes and a call to serve():

    from dflowplugin import Field, Node, Port, serve

    class Scale(Node):
        name = "scale"
        config = [Field("factor", "number", default=2.0)]

        def ports(self, config):
            return [Port("in", "any"), Port("out", output=True, same_as="in")]

        def run(self, r):
            for item in r.recv("in"):
                r.send("out", item)

    serve(Scale())

Everything a plugin uses is here, at the top; the modules are:

    items     the item codec: Blob, Tokens, Hidden, encode, decode
    node      what a plugin defines: Node, Field, Port
    replica   Replica, what Node.run is given: recv, send, metric
    groups    group kinds' collectives and steps (Step)
    shm       shared memory: large items by reference
    service   serve: the handshake, the Node service, the lifeline
    times, waiting   what the replica tells dflow of its time and waits
    dflow_pb2 generated from plugins/proto/dflow.proto

Needs grpcio, protobuf and numpy (Debian: python3-grpcio, python3-protobuf,
python3-numpy). The layouts of the wire types are in docs/plugins.md.
"""

from .groups import COMPUTE, DATA_WAIT, Step
from .items import BadItem, Blob, Hidden, Tokens, decode, encode, pieces
from .node import Field, Node, Port
from .replica import CHUNK, Replica
from .service import (COOKIE, COOKIE_KEY, GROUP_WINDOW, INPUT_WINDOW, LIFELINE_ENV, OUTPUT_WINDOW,
                      PARENT_POLL, serve)
from .times import TIMES_EVERY

# CONCURRENT, set before serve, says a node may compute in threads of its
# own while one of its recv or send calls waits: the plugin then does not
# tell dflow when its node waits (Waiting), and dflow's deadlock detector
# treats its stages as always able to move.
CONCURRENT = False

__all__ = [
    "BadItem", "Blob", "CHUNK", "COMPUTE", "CONCURRENT", "COOKIE", "COOKIE_KEY", "DATA_WAIT", "Field",
    "GROUP_WINDOW", "Hidden", "INPUT_WINDOW", "LIFELINE_ENV", "Node", "OUTPUT_WINDOW", "PARENT_POLL",
    "Port", "Replica", "Step", "TIMES_EVERY", "Tokens", "decode", "encode", "pieces", "serve",
]
