"""The service: go-plugin's handshake and health check, the
dflow.plugin.v1.Node service (Describe, Check, Run) over gRPC, and the
watch that ends the process when dflow has gone. serve(...) runs it."""

import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from concurrent import futures

import grpc

from . import dflow_pb2 as pb
from . import shm, times
from .items import BadItem, decode
from .node import _config
from .replica import CHUNK, _EOF, Replica, _Credit
from .times import TIMES_EVERY, _Times
from .waiting import _LOOK, _Watch

COOKIE_KEY, COOKIE = "DFLOW_PLUGIN_MAGIC_COOKIE", "dflow-node-plugin-v1"
INPUT_WINDOW = 8  # input items a replica holds at most per port (its credit)
GROUP_WINDOW = 2  # the same for a group kind's replica
OUTPUT_WINDOW = 64  # messages a replica queues for dflow before send blocks

_DONE = object()  # in the output queue: the replica's last message is queued


class _Service:
    def __init__(self, kinds, concurrent=False):
        self.kinds = {k.name: k for k in kinds}
        # concurrent: the package's CONCURRENT, as serve found it
        self.concurrent = concurrent

    def describe(self, request, context):
        resp = pb.DescribeResponse(batches=True, port_credit=True, output_credit=True,
                                   shared_memory=shm._enabled(), waiting=not self.concurrent,
                                   times=times._enabled())
        for k in self.kinds.values():
            group = bool(k.group) and _VERSION >= 2
            kind = resp.kinds.add(name=k.name, doc=k.doc, group=group, restores=group and bool(getattr(k, "restores", False)))
            for f in k.config:
                kind.config.add(name=f.name, type=f.type, required=f.required, doc=f.doc,
                                default_json="" if f.default is None else json.dumps(f.default),
                                path=f.path)
        return resp

    def check(self, request, context):
        kind = self.kinds.get(request.kind)
        if kind is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no node kind %r" % request.kind)
        resp = pb.CheckResponse()
        config, errors = _config(kind, request.config_json)
        if config is not None:
            errors += kind.check(config)
            for p in kind.ports(config):
                resp.ports.add(name=p.name, output=p.output, type=p.type, same_as=p.same_as, doc=p.doc)
        for field, message in errors:
            resp.errors.add(field=field, message=message)
        return resp

    def run(self, requests, context):
        first = next(requests)
        start = first.start
        kind = self.kinds.get(start.kind)
        if kind is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no node kind %r" % start.kind)
        config, errors = _config(kind, start.config_json)
        # Bounded: a node that sends faster than dflow takes its items
        # waits in send, as a Go node waits in Send.
        out = queue.Queue(OUTPUT_WINDOW)
        r = Replica(start, config, out)
        r._watch = _Watch(start.waiting and not self.concurrent, out)
        ports = kind.ports(config)
        r._times = _Times(start.times, not any(not p.output for p in ports))
        # A group member holds few items per port: the members share their
        # input edges, and one that held credit for many would take items
        # the others are waiting for (its steps full while theirs are empty).
        window = GROUP_WINDOW if start.group else INPUT_WINDOW
        # A member of a kind that restores asks for its items one at a time
        # as it trains them (Replica._on_demand).
        r._on_demand = bool(start.group and getattr(kind, "restores", False))
        if r._on_demand:
            window = 1
        for p in ports:
            if not p.output:
                # Unbounded: credit bounds it (deliver checks), and the end
                # of input must go in even when it is full.
                r._inputs[p.name] = queue.Queue()
            elif start.output_credit:
                r._credit[p.name] = _Credit()
        if start.HasField("pools"):
            # Attached goes first, before any credit: dflow sends items by
            # reference only once it knows the pools are mapped.
            error = ""
            if not shm._enabled():
                error = "shared memory is off in this plugin (DFLOW_PLUGIN_SHM=off)"
            else:
                try:
                    r._pools = shm._Pools.map(start.pools)
                except Exception as e:
                    error = "mapping dflow's pools: %s" % e
            yield pb.Message(attached=pb.Attached(error=error))
        # Credit per port (port_credit): dflow feeds each input as its
        # credit allows, so a node may read its inputs in any order.
        for name in r._inputs:
            if not r._on_demand:
                out.put(pb.Message(credit=pb.Credit(n=window, port=name)))

        failure = []

        def deliver(port, typ, payload, ref=None):
            if port not in r._inputs:
                raise BadItem("an item for input port %r, which the node does not have" % port)
            q = r._inputs[port]
            if q.qsize() >= window:  # it holds all the credit granted: dflow overran it
                raise BadItem("dflow sent more items on %r than the plugin granted it credit for" % port)
            held = None
            if ref is not None:
                p = r._pools
                if p is None or ref.pool != 0 or ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > len(p.arr[0]):
                    raise BadItem("an item by reference to bytes %d-%d of pool %d, which dflow does not send from"
                                  % (ref.offset, ref.offset + ref.length, ref.pool))
                with p.lock:
                    p.held[ref.offset] = ref.length
                held = ref.offset
                payload = p.view[0][ref.offset:ref.offset + ref.length]
            item = decode(typ, payload)
            if held is not None and not isinstance(item, memoryview):
                item.shared = True  # a view of dflow's shared memory (see Replica.recv)
            q.put((item, held))

        def receive():
            buf = bytearray()
            try:
                for m in requests:
                    which = m.WhichOneof("msg")
                    if which == "item" and m.item.HasField("ref"):
                        deliver(m.item.port, m.item.type, None, m.item.ref)
                    elif which == "item":
                        buf += m.item.payload
                        if not m.item.more:
                            deliver(m.item.port, m.item.type, buf)
                            buf = bytearray()
                    elif which == "batch":
                        for it in m.batch.items:
                            if it.HasField("ref"):
                                deliver(it.port, it.type, None, it.ref)
                            else:
                                deliver(it.port, it.type, bytearray(it.payload))
                    elif which == "eof" and m.eof.port in r._inputs:
                        r._inputs[m.eof.port].put(_EOF)
                    elif which == "release":
                        for ref in m.release.refs:
                            if r._pools is None or ref.pool != 1:
                                raise BadItem("dflow released pool %d's region, which the plugin did not send" % ref.pool)
                            r._pools.release(ref.offset)
                    elif which == "collective_result":
                        r._results.put(m.collective_result)
                    elif which == "credit":
                        if m.credit.port not in r._credit:
                            raise BadItem("credit on %r, which is not an output port held to credit" % m.credit.port)
                        r._credit[m.credit.port].grant(m.credit.n)
                    r._watch.received()  # applied: now counted
            except Exception as e:  # a broken input ends the replica with the reason
                failure.append(e)
                for q in r._inputs.values():
                    q.put(_EOF)
            for c in r._credit.values():  # no more credit can come
                c.close()
            r._results.put(None)  # nor the answer to a collective

        def work():
            error = ""
            try:
                kind.run(r)
            except Exception:
                error = traceback.format_exc(limit=3).strip()
            if failure:
                error = "input: %s" % failure[0]
            if r._inputs:
                r._times.next()  # the item in hand, if the node left before the end of its input
                r._times.none()
            t = r._times.message(final=True)
            if t is not None:
                out.put(t)
            out.put(pb.Message(done=pb.Done(error=error)))
            out.put(_DONE)

        threading.Thread(target=receive, daemon=True).start()
        threading.Thread(target=work, daemon=True).start()
        done = None  # Done goes last, after everything queued before it
        while True:
            if r._times.on:
                try:
                    m = out.get(timeout=TIMES_EVERY)
                except queue.Empty:
                    m = _LOOK  # no message: only Times to say, if due
                t = r._times.message()
                if t is not None:
                    yield t
            else:
                m = out.get()
            if m is _DONE:
                # Done may have come alone in the batch before this, its
                # end (_DONE) not yet queued: it goes now. (It was dropped,
                # and dflow saw the stream end without Done, when work's
                # two puts fell either side of a batch: a loaded machine
                # met it in the conformance suite's Large case.)
                if done is not None:
                    yield done
                return
            if m is _LOOK or not start.batches or m.WhichOneof("msg") == "item" and (m.item.more or len(m.item.payload) > CHUNK):
                if m is not _LOOK:
                    yield m  # a large item's chunks go as they come
                w = r._watch.waiting()
                if w is not None:
                    yield w
                continue
            # dflow takes batches: with this message, send the others
            # already queued: whole items together in Batches of at most
            # CHUNK bytes (in order), credit summed per port, metrics
            # merged by name (counters added, gauges the last value).
            pending = [m]
            while len(pending) < 256:
                try:
                    pending.append(out.get_nowait())
                except queue.Empty:
                    break
            credit, batch, size, metrics, end, send = {}, [], 0, {}, False, []
            for x in pending:
                if x is _LOOK:
                    continue
                which = None if x is _DONE else x.WhichOneof("msg")
                if which == "credit":
                    credit[x.credit.port] = credit.get(x.credit.port, 0) + x.credit.n
                elif which == "metric":
                    key = (x.metric.name, x.metric.counter)
                    if x.metric.counter and key in metrics:
                        metrics[key].metric.value += x.metric.value
                    else:
                        metrics[key] = x
                elif which == "item" and not x.item.more and size + len(x.item.payload) <= CHUNK:
                    batch.append(x.item)
                    size += len(x.item.payload)
                else:  # a chunk, a full batch, Done: after the items before it
                    if batch:
                        send.append(_batch(batch))
                        batch, size = [], 0
                    if which == "item" and not x.item.more and len(x.item.payload) <= CHUNK:
                        batch, size = [x.item], len(x.item.payload)
                    elif x is _DONE:
                        end = True
                    elif which == "done":
                        done = x
                    else:
                        send.append(x)
            if batch:
                send.append(_batch(batch))
            for port, n in credit.items():  # first: dflow may be waiting for it
                yield pb.Message(credit=pb.Credit(n=n, port=port))
            yield from send
            yield from metrics.values()
            if end:
                if done is not None:
                    yield done
                return
            w = r._watch.waiting()
            if w is not None:
                yield w


def _batch(items):
    if len(items) == 1:
        return pb.Message(item=items[0])
    return pb.Message(batch=pb.Batch(items=items))


def serve(*kinds):
    """Serves the node kinds to dflow until dflow stops the process. Call it
    from the plugin's main."""
    if os.environ.get(COOKIE_KEY) != COOKIE:
        sys.stderr.write("This is a dflow plugin: dflow starts it when a spec uses one of its nodes.\n")
        sys.exit(1)
    from . import CONCURRENT  # the package's, as the plugin set it
    _watch_parent()
    global _VERSION
    _VERSION = _version()
    svc = _Service(kinds, concurrent=CONCURRENT)
    raw = dict(request_deserializer=None, response_serializer=None)
    handlers = [
        grpc.method_handlers_generic_handler("dflow.plugin.v1.Node", {
            "Describe": grpc.unary_unary_rpc_method_handler(
                svc.describe, pb.DescribeRequest.FromString, pb.DescribeResponse.SerializeToString),
            "Check": grpc.unary_unary_rpc_method_handler(
                svc.check, pb.CheckRequest.FromString, pb.CheckResponse.SerializeToString),
            "Run": grpc.stream_stream_rpc_method_handler(
                svc.run, pb.Message.FromString, pb.Message.SerializeToString),
        }),
        # go-plugin asks the standard health service about "plugin":
        # SERVING is field 1 = 1.
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"\x08\x01", **raw),
        }),
        # go-plugin's graceful stop: answer, then exit.
        grpc.method_handlers_generic_handler("plugin.GRPCController", {
            "Shutdown": grpc.unary_unary_rpc_method_handler(_shutdown, **raw),
        }),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), handlers=handlers,
                         options=[("grpc.max_receive_message_length", 8 << 20)])
    sock = os.path.join(tempfile.mkdtemp(prefix="dflow-py-"), "plugin.sock")
    server.add_insecure_port("unix:" + sock)
    server.start()
    global _sockdir
    _sockdir = os.path.dirname(sock)
    # The handshake: core protocol 1, app protocol (_VERSION), network,
    # address, grpc.
    sys.stdout.write("1|%d|unix|%s|grpc\n" % (_VERSION, sock))
    sys.stdout.flush()
    server.wait_for_termination()


_sockdir = None
_VERSION = 1  # the protocol version answered in the handshake (serve sets it)


def _version():
    """The newest protocol version dflow offers (PLUGIN_PROTOCOL_VERSIONS)
    that this module speaks: 2, or 1 for a dflow that offers only that."""
    offered = os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",")
    return 2 if "2" in [v.strip() for v in offered] else 1


LIFELINE_ENV = "DFLOW_PLUGIN_LIFELINE"
PARENT_POLL = 0.2  # seconds between checks that the parent is still there


def _watch_parent():
    """Ends the process when dflow has gone, however it ended (SIGKILL
    included): at end-of-file on the lifeline, the stdin whose write end
    only dflow holds (when dflow says so in DFLOW_PLUGIN_LIFELINE), and
    when the parent changes (dflow, or the wrapper script that ran this
    process, died). A process that a wrapper script runs without exec
    inherits the lifeline too."""
    if os.environ.get(LIFELINE_ENV) == "stdin":
        def lifeline():
            try:
                while os.read(0, 1 << 16):
                    pass
            except OSError:
                pass
            _parent_gone("its lifeline, the plugin's stdin, closed")
        threading.Thread(target=lifeline, daemon=True).start()
    ppid = os.getppid()
    if ppid > 1:  # 1: started by init, or in a container as its child
        def poll():
            while os.getppid() == ppid:
                time.sleep(PARENT_POLL)
            _parent_gone("the plugin's parent, process %d, exited" % ppid)
        threading.Thread(target=poll, daemon=True).start()


def _parent_gone(why):
    try:  # stderr is a pipe to dflow, which may be gone with it
        sys.stderr.write("dflow-plugin: dflow has gone (%s): exiting\n" % why)
        sys.stderr.flush()
    except Exception:
        pass
    if _sockdir:
        shutil.rmtree(_sockdir, ignore_errors=True)
    os._exit(1)


def _shutdown(request, context):
    def stop():
        shutil.rmtree(_sockdir, ignore_errors=True)
        os._exit(0)
    threading.Timer(0.05, stop).start()
    return b""
