"""The replica (dflowplugin.replica) without dflow: what recv and send put
on the stream to dflow, credit both ways, and large items in chunks."""

import queue
import threading
import types
import unittest

from dflowplugin import CHUNK, Blob, decode
from dflowplugin.replica import _EOF, Replica, _Credit


def replica():
    start = types.SimpleNamespace(stage="s", replica=0, replicas=1, device="cpu")
    r = Replica(start, {"x": 1}, queue.Queue())
    return r


def said(r):
    out = []
    while not r._out.empty():
        out.append(r._out.get_nowait())
    return out


class TestRecv(unittest.TestCase):
    def test_items_then_end_each_credited(self):
        r = replica()
        q = r._inputs["in"] = queue.Queue()
        for i in range(3):
            q.put((Blob(0, i, b""), None))
        q.put(_EOF)
        self.assertEqual([b.seq for b in r.recv("in")], [0, 1, 2])
        credits = [(m.credit.port, m.credit.n) for m in said(r)]
        self.assertEqual(credits, [("in", 1)] * 3)
        self.assertEqual(list(r.recv("in")), [])  # and at every later ask

    def test_config_and_place(self):
        r = replica()
        self.assertEqual((r.stage, r.index, r.replicas, r.device, r.config), ("s", 0, 1, "cpu", {"x": 1}))
        self.assertFalse(r.group)


class TestOnDemand(unittest.TestCase):
    """A member of a kind that restores asks for its items one at a time,
    as it takes each (so that the item dflow holds in hand is the one it
    trains in the group's step): credit goes only when the node asks and
    nothing waits, never ahead."""

    def test_credit_only_when_asked(self):
        r = replica()
        r._on_demand = True
        q = r._inputs["in"] = queue.Queue()
        got = []
        t = threading.Thread(target=lambda: got.append(r._take("in", [], [])))
        t.start()
        m = r._out.get(timeout=10)  # asked: credit for one
        self.assertEqual((m.credit.port, m.credit.n), ("in", 1))
        q.put((Blob(0, 7, b""), None))
        t.join(10)
        self.assertEqual([b.seq for b in got], [7])
        self.assertEqual(said(r), [])  # taken: no credit ahead
        q.put((Blob(0, 8, b""), None))  # one already there (sent before)
        self.assertEqual(r._take("in", [], []).seq, 8)
        self.assertEqual(said(r), [])  # none asked: nothing waited

    def test_restore_step(self):
        from dflowplugin import dflow_pb2 as pb
        first = Replica(pb.Start(stage="s", replica=0, replicas=2, group=True), {}, queue.Queue())
        self.assertIsNone(first.restore_step)
        again = Replica(pb.Start(stage="s", replica=0, replicas=2, group=True, restore_step=4), {}, queue.Queue())
        self.assertEqual(again.restore_step, 4)
        afresh = Replica(pb.Start(stage="s", replica=0, replicas=2, group=True, restore_step=-1), {}, queue.Queue())
        self.assertEqual(afresh.restore_step, -1)


class TestSend(unittest.TestCase):
    def test_small_item_one_message(self):
        r = replica()
        r.send("out", Blob(1, 2, b"abc"))
        (m,) = said(r)
        self.assertEqual((m.item.port, m.item.type, m.item.more, m.item.size), ("out", "blob", False, 19))
        got = decode("blob", m.item.payload)
        self.assertEqual((got.replica, got.seq, got.data), (1, 2, b"abc"))

    def test_large_item_in_chunks(self):
        r = replica()
        data = bytes(range(256)) * (CHUNK // 256 * 2 + 1)
        r.send("out", data)
        ms = said(r)
        self.assertEqual(len(ms), 3)
        self.assertEqual([m.item.more for m in ms], [True, True, False])
        self.assertEqual(ms[0].item.size, len(data))  # the first says the whole size
        self.assertEqual([m.item.size for m in ms[1:]], [0, 0])
        self.assertEqual(b"".join(m.item.payload for m in ms), data)
        self.assertTrue(all(len(m.item.payload) <= CHUNK for m in ms))

    def test_empty_item(self):
        r = replica()
        r.send("out", b"")
        (m,) = said(r)
        self.assertEqual((m.item.type, m.item.payload, m.item.more), ("bytes", b"", False))

    def test_waits_for_credit(self):
        r = replica()
        c = r._credit["out"] = _Credit()
        sent = threading.Event()
        t = threading.Thread(target=lambda: (r.send("out", b"x"), sent.set()))
        t.start()
        self.assertFalse(sent.wait(0.2))  # no credit: it waits
        self.assertTrue(r._out.empty())
        c.grant(1)
        self.assertTrue(sent.wait(30))
        t.join(30)
        self.assertEqual(len(said(r)), 1)

    def test_credit_closed(self):
        r = replica()
        c = r._credit["out"] = _Credit()
        c.close()
        with self.assertRaises(BrokenPipeError):
            r.send("out", b"x")

    def test_metric(self):
        r = replica()
        r.metric("loss", 0.5)
        r.metric("seen", 3, counter=True)
        ms = [(m.metric.name, m.metric.value, m.metric.counter) for m in said(r)]
        self.assertEqual(ms, [("loss", 0.5, False), ("seen", 3.0, True)])


class TestCredit(unittest.TestCase):
    def test_take_what_was_granted(self):
        c = _Credit()
        self.assertTrue(c.none())
        self.assertFalse(c.try_take())
        c.grant(2)
        self.assertTrue(c.try_take())
        c.take()
        self.assertFalse(c.try_take())


if __name__ == "__main__":
    unittest.main()
