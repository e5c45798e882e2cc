"""The service (dflowplugin.service) called as gRPC would call it, with no
network: a kind's config checked, Describe and Check answered, and a
replica run over a stream of messages."""

import io
import os
import threading
import unittest
from unittest import mock

from dflowplugin import Blob, Field, Node, Port, decode, encode, serve
from dflowplugin import dflow_pb2 as pb
from dflowplugin import service
from dflowplugin.node import _config
from dflowplugin.times import _bucket

TIMEOUT = 30


class Scale(Node):
    name = "scale"
    doc = "Multiplies each blob's seq."
    config = [Field("factor", "int", default=2), Field("label", "string", required=True, doc="a name"),
              Field("files", "list(string)", path="read")]

    def ports(self, config):
        return [Port("in", "blob"), Port("out", output=True, same_as="in")]

    def check(self, config):
        return [("factor", "must be positive")] if config["factor"] <= 0 else []

    def run(self, r):
        for b in r.recv("in"):
            r.send("out", Blob(b.replica, b.seq * r.config["factor"], b.data))
        r.metric("label_" + r.config["label"], 1)


class Steps(Node):
    name = "steps"
    group = True


class Aborted(Exception):
    pass


class Context:
    def abort(self, code, message):
        raise Aborted(code, message)


class TestConfig(unittest.TestCase):
    def test_defaults_filled(self):
        self.assertEqual(_config(Scale, '{"label": "a"}'), ({"factor": 2, "label": "a", "files": None}, []))

    def test_required_and_unknown(self):
        config, errors = _config(Scale, '{"factr": 3}')
        self.assertEqual(sorted(errors), [("factr", "unknown attribute"), ("label", "required")])

    def test_empty(self):
        self.assertEqual(_config(Scale, "")[1], [("label", "required")])

    def test_not_json(self):
        config, errors = _config(Scale, "{")
        self.assertIsNone(config)
        self.assertEqual(errors[0][0], "")
        self.assertIn("config is not JSON", errors[0][1])


class TestDescribeCheck(unittest.TestCase):
    def test_describe(self):
        with mock.patch.object(service, "_VERSION", 2):
            resp = service._Service([Scale(), Steps()]).describe(pb.DescribeRequest(), Context())
        self.assertTrue(resp.batches and resp.port_credit and resp.output_credit and resp.waiting)
        kinds = {k.name: k for k in resp.kinds}
        self.assertEqual(sorted(kinds), ["scale", "steps"])
        self.assertEqual(kinds["scale"].doc, "Multiplies each blob's seq.")
        fields = [(f.name, f.type, f.required, f.default_json, f.path) for f in kinds["scale"].config]
        self.assertEqual(fields, [("factor", "int", False, "2", ""), ("label", "string", True, "", ""),
                                  ("files", "list(string)", False, "", "read")])
        self.assertTrue(kinds["steps"].group)
        self.assertFalse(kinds["scale"].group)

    def test_group_kinds_need_version_2(self):
        with mock.patch.object(service, "_VERSION", 1):
            resp = service._Service([Steps()]).describe(pb.DescribeRequest(), Context())
        self.assertFalse(resp.kinds[0].group)

    def test_concurrent_never_says_waiting(self):
        resp = service._Service([Scale()], concurrent=True).describe(pb.DescribeRequest(), Context())
        self.assertFalse(resp.waiting)

    def test_check(self):
        svc = service._Service([Scale()])
        resp = svc.check(pb.CheckRequest(kind="scale", config_json='{"label": "x", "factor": 0}'), Context())
        self.assertEqual([(e.field, e.message) for e in resp.errors], [("factor", "must be positive")])
        self.assertEqual([(p.name, p.output, p.type, p.same_as) for p in resp.ports],
                         [("in", False, "blob", ""), ("out", True, "", "in")])

    def test_check_unknown_kind(self):
        with self.assertRaises(Aborted) as cm:
            service._Service([Scale()]).check(pb.CheckRequest(kind="nope"), Context())
        self.assertIn("no node kind 'nope'", cm.exception.args[1])


def run(kind, start, inputs):
    """The messages a replica of kind sends for a Start and the input
    messages after it, the stream then left open until the replica is
    done; fails after TIMEOUT."""
    done = threading.Event()

    def requests():
        yield pb.Message(start=start)
        yield from inputs
        done.wait(TIMEOUT)  # the stream stays open while the replica runs

    out, error = [], []

    def collect():
        try:
            for m in service._Service([kind]).run(requests(), Context()):
                out.append(m)
        except Exception as e:  # said by the test
            error.append(e)
        done.set()

    t = threading.Thread(target=collect)
    t.start()
    t.join(TIMEOUT)
    if t.is_alive():
        done.set()
        raise AssertionError("the replica did not finish in %ds; it said %s" % (TIMEOUT, out))
    if error:
        raise error[0]
    return out


class TestRun(unittest.TestCase):
    def start(self, **kw):
        return pb.Start(kind="scale", config_json='{"label": "a", "factor": 3}', stage="s", replica=0, replicas=1, **kw)

    def items(self, n):
        return [pb.Message(item=pb.Item(port="in", type="blob", payload=encode(Blob(0, i, b"d"))[1])) for i in range(n)] + \
            [pb.Message(eof=pb.Eof(port="in"))]

    def test_items_through(self):
        out = run(Scale(), self.start(), self.items(3))
        kinds = [m.WhichOneof("msg") for m in out]
        self.assertEqual(kinds[0], "credit")  # the input's window first
        self.assertEqual(out[0].credit.n, service.INPUT_WINDOW)
        self.assertEqual(kinds[-1], "done")
        self.assertEqual(out[-1].done.error, "")
        seqs = [decode("blob", m.item.payload).seq for m in out if m.WhichOneof("msg") == "item"]
        self.assertEqual(seqs, [0, 3, 6])
        self.assertIn("label_a", [m.metric.name for m in out if m.WhichOneof("msg") == "metric"])

    def test_batches(self):
        out = run(Scale(), self.start(batches=True), self.items(5))
        self.assertEqual(out[-1].WhichOneof("msg"), "done")
        seqs = []
        for m in out:
            if m.WhichOneof("msg") == "batch":
                seqs += [decode("blob", it.payload).seq for it in m.batch.items]
            elif m.WhichOneof("msg") == "item":
                seqs.append(decode("blob", m.item.payload).seq)
        self.assertEqual(seqs, [0, 3, 6, 9, 12])

    def test_an_item_for_no_port_fails_the_replica(self):
        inputs = [pb.Message(item=pb.Item(port="nope", type="blob", payload=encode(Blob(0, 0, b""))[1]))]
        out = run(Scale(), self.start(), inputs)
        self.assertEqual(out[-1].WhichOneof("msg"), "done")
        self.assertIn("input port 'nope', which the node does not have", out[-1].done.error)

    def test_node_error_said_in_done(self):
        class Fails(Scale):
            def run(self, r):
                raise RuntimeError("the model file is missing")
        out = run(Fails(), self.start(), [])
        self.assertIn("the model file is missing", out[-1].done.error)


class TestServe(unittest.TestCase):
    def test_version(self):
        for offered, want in (("", 1), ("1", 1), ("1,2", 2), ("2, 3", 2)):
            with mock.patch.dict(os.environ, {"PLUGIN_PROTOCOL_VERSIONS": offered}):
                self.assertEqual(service._version(), want, offered)

    def test_not_started_by_dflow(self):
        env = dict(os.environ)
        env.pop(service.COOKIE_KEY, None)
        with mock.patch.dict(os.environ, env, clear=True), mock.patch("sys.stderr", new=io.StringIO()) as err:
            with self.assertRaises(SystemExit) as cm:
                serve(Scale())
        self.assertEqual(cm.exception.code, 1)
        self.assertIn("This is a dflow plugin", err.getvalue())


class TestBuckets(unittest.TestCase):
    def test_bucket(self):
        # 0 under a microsecond, else floor(18 log2(microseconds)) + 1,
        # as the Go SDK and dflow count them.
        self.assertEqual([_bucket(ns) for ns in (0, 999, 1000, 1999, 2000, 4000)], [0, 0, 1, 18, 19, 37])


if __name__ == "__main__":
    unittest.main()
