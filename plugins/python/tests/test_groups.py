"""Group kinds (dflowplugin.groups): steps in lockstep over members whose
inputs differ, and the collectives' messages to dflow and answers."""

import queue
import threading
import types
import unittest

from dflowplugin import COMPUTE, DATA_WAIT, Replica
from dflowplugin import dflow_pb2 as pb
from dflowplugin.groups import Group

TIMEOUT = 30  # seconds a member may wait for the others before the test fails


class Hub:
    """dflow's group, in miniature: an all_reduce over n members, each
    call returning when every member has made its own."""

    def __init__(self, n):
        self.n = n
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(n, timeout=TIMEOUT)
        self.acc = None
        self.calls = 0

    def all_reduce(self, values):
        with self.lock:
            if self.acc is None:
                self.acc = [0.0] * len(values)
            self.acc = [a + float(v) for a, v in zip(self.acc, values)]
        if self.barrier.wait() == 0:
            self.calls += 1
        result = list(self.acc)
        if self.barrier.wait() == 0:
            self.acc = None
        self.barrier.wait()
        return result, self.n


class Member(Group):
    """A member whose input is items (their regions are their values), on
    the hub: what steps stands on (_take, all_reduce, metric) and nothing
    else."""

    def __init__(self, hub, items):
        self._group_init(True)
        self.hub, self.input = hub, list(items)
        self.metrics, self.released = [], []

    def _take(self, port, drop, held):
        self.released.append(list(drop))  # what this ask gives back
        del drop[:]
        if not self.input:
            return None
        item = self.input.pop(0)
        held.append(item)
        return item

    def all_reduce(self, values):
        return self.hub.all_reduce(values)

    def metric(self, name, value, counter=False):
        self.metrics.append((name, value, counter))


def lockstep(inputs, k):
    """Each member's steps, as (index, items, total, members), and the
    members."""
    hub = Hub(len(inputs))
    members = [Member(hub, items) for items in inputs]
    got = [None] * len(members)
    errors = []

    def run(i):
        try:
            got[i] = [(s.index, s.items, s.total, s.members) for s in members[i].steps("in", k)]
        except Exception as e:  # said by the test
            errors.append(e)
            hub.barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 5)
        if t.is_alive():
            raise AssertionError("a member is still in its steps after %ds" % (TIMEOUT + 5))
    if errors:
        raise errors[0]
    return got, members, hub


class TestSteps(unittest.TestCase):
    def test_members_with_uneven_inputs_step_together(self):
        got, _, hub = lockstep([[0, 1, 2, 3, 4], [10, 11], []], k=2)
        self.assertEqual(got[0], [(0, [0, 1], 4, 3), (1, [2, 3], 2, 3), (2, [4], 1, 3)])
        self.assertEqual(got[1], [(0, [10, 11], 4, 3), (1, [], 2, 3), (2, [], 1, 3)])
        self.assertEqual(got[2], [(0, [], 4, 3), (1, [], 2, 3), (2, [], 1, 3)])
        # One all_reduce a step, and one more that finds no items: the end.
        self.assertEqual(hub.calls, 4)

    def test_one_item_a_step(self):
        got, _, _ = lockstep([[1, 2, 3], [4]], k=1)
        self.assertEqual([len(s[1]) for s in got[0]], [1, 1, 1])
        self.assertEqual([len(s[1]) for s in got[1]], [1, 0, 0])
        self.assertEqual([s[2] for s in got[0]], [2, 1, 1])

    def test_no_input_anywhere(self):
        got, _, hub = lockstep([[], []], k=3)
        self.assertEqual(got, [[], []])
        self.assertEqual(hub.calls, 1)

    def test_a_step_gives_back_the_last_steps_regions(self):
        # Items by reference are valid until the next step: its first ask
        # gives back the regions of the step before, and only it.
        # (The last step's stay held: no ask follows it.)
        _, members, _ = lockstep([[1, 2, 3, 4, 5]], k=2)
        self.assertEqual(members[0].released[:5], [[], [], [1, 2], [], [3, 4]])

    def test_each_step_is_measured(self):
        _, members, _ = lockstep([[1, 2], [3]], k=1)
        for m in members:
            names = [name for name, _, _ in m.metrics]
            self.assertEqual(names.count(DATA_WAIT), 3)  # two steps, and the end
            self.assertEqual(names.count(COMPUTE), 3 + 2)  # a share of each all_reduce; each step's own
            for name, value, counter in m.metrics:
                self.assertTrue(counter, name)
                self.assertGreaterEqual(value, 0, name)

    def test_k_at_least_one(self):
        m = Member(Hub(1), [1])
        with self.assertRaises(ValueError):
            next(m.steps("in", 0))


def replica(group=True):
    start = types.SimpleNamespace(stage="train", replica=1, replicas=2, device="", group=group)
    return Replica(start, {}, queue.Queue())


def answer(r, reply):
    """Plays dflow for one collective: the Collective r sent, after reply
    has filled in its result."""
    m = r._out.get(timeout=TIMEOUT)
    c = m.collective
    res = pb.CollectiveResult(id=c.id)
    reply(c, res)
    r._results.put(res)
    return c


class TestCollectives(unittest.TestCase):
    def call(self, r, fn, reply):
        """fn() on r, with dflow's answer; fn's result and the Collective
        sent."""
        said = []
        t = threading.Thread(target=lambda: said.append(answer(r, reply)))
        t.start()
        try:
            got = fn()
        finally:
            t.join(TIMEOUT)
        return got, said[0]

    def test_all_reduce(self):
        r = replica()

        def reply(c, res):
            res.values.extend([v * 2 for v in c.values])
            res.members = 2
        got, c = self.call(r, lambda: r.all_reduce([1, 2.5]), reply)
        self.assertEqual(c.op, pb.COLLECTIVE_ALL_REDUCE)
        self.assertEqual(list(c.values), [1.0, 2.5])
        self.assertEqual(got, ([2.0, 5.0], 2))

    def test_ids_go_up(self):
        r = replica()
        _, a = self.call(r, r.barrier, lambda c, res: None)
        _, b = self.call(r, r.barrier, lambda c, res: None)
        self.assertEqual((a.op, b.op), (pb.COLLECTIVE_BARRIER, pb.COLLECTIVE_BARRIER))
        self.assertLess(a.id, b.id)

    def test_an_answer_to_another_call_is_passed_over(self):
        r = replica()
        r._results.put(pb.CollectiveResult(id=999, last=False))

        def reply(c, res):
            res.last = True
        got, c = self.call(r, r.finish, reply)
        self.assertEqual(c.op, pb.COLLECTIVE_FINISH)
        self.assertTrue(got)

    def test_saved_says_its_step(self):
        r = replica()
        _, c = self.call(r, lambda: r.saved(40), lambda c, res: None)
        self.assertEqual((c.op, c.step), (pb.COLLECTIVE_SAVED, 40))

    def test_error(self):
        r = replica()

        def reply(c, res):
            res.error = "member 0 left"
        with self.assertRaises(RuntimeError) as cm:
            self.call(r, r.barrier, reply)
        self.assertIn("member 0 left", str(cm.exception))

    def test_stream_ended(self):
        r = replica()
        r._results.put(None)
        with self.assertRaises(BrokenPipeError):
            r.barrier()
        with self.assertRaises(BrokenPipeError):  # and every later call
            r.all_reduce([1])

    def test_no_group(self):
        r = replica(group=False)
        with self.assertRaises(RuntimeError) as cm:
            r.all_reduce([1])
        self.assertIn("not a group kind", str(cm.exception))
        self.assertTrue(r._out.empty())


if __name__ == "__main__":
    unittest.main()
