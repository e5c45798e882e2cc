"""Group kinds (Node.group, protocol version 2): the collectives a group
member's replica has, through dflow's group (barrier, all_reduce, finish,
saves, saved), and steps, its input in lockstep with the other members."""

import queue
import threading
import time

from . import dflow_pb2 as pb
from .times import _BLOCKED

# The node metrics of Replica.steps (report.DataWait and report.Compute in
# dflow): a step's wait for its data and its compute, in seconds.
DATA_WAIT, COMPUTE = "data_wait_seconds", "compute_seconds"


class Step:
    """One step of a group member's input (Replica.steps)."""

    def __init__(self, index, items, total, members):
        self.index, self.items, self.total, self.members = index, items, total, members


class Group:
    """A group member's collectives, part of every Replica: they work on a
    group kind's replica (self.group), and raise RuntimeError on any
    other. Replica supplies what they stand on: _put (a message to
    dflow), _take (a port's next item, None at its end), metric, and
    _times."""

    def _group_init(self, group):
        # group: the replica is a member of its stage's group (a group kind
        # served at protocol version 2), and has its collectives
        self.group = bool(group)
        self._results = queue.Queue()  # CollectiveResults from dflow
        self._collective = threading.Lock()  # one collective at a time
        self._next_id = 0

    def _call(self, op, values=(), step=0):
        if not self.group:
            raise RuntimeError("this replica has no group: its kind is not a group kind (Node.group), "
                               "or dflow speaks protocol version 1")
        with self._collective:
            self._next_id += 1
            cid = self._next_id
            with self._times.wait(_BLOCKED):
                self._put(pb.Message(collective=pb.Collective(id=cid, op=op, values=values, step=step)))
                while True:
                    r = self._results.get()
                    if r is None:
                        self._results.put(None)  # for any later call too
                        raise BrokenPipeError("the stream to dflow ended during a collective")
                    if r.id == cid:
                        break
            if r.error:
                raise RuntimeError("collective: %s" % r.error)
            return r

    def barrier(self):
        """Waits until every member still in the group has reached it."""
        self._call(pb.COLLECTIVE_BARRIER)

    def all_reduce(self, values):
        """The element-wise sum of values (floats, the same length on every
        member) over the members taking part, and how many took part."""
        r = self._call(pb.COLLECTIVE_ALL_REDUCE, values=[float(v) for v in values])
        return list(r.values), r.members

    def finish(self):
        """Leaves the group; True on exactly one member, its last: the one
        that writes the group's final save."""
        return self._call(pb.COLLECTIVE_FINISH).last

    def saves(self):
        """Says the group saves its state every so many steps, each save
        followed by saved (every member calls it, before its first step):
        its inputs are then settled only once a save holds them."""
        self._call(pb.COLLECTIVE_SAVES)

    def saved(self, step):
        """Says the group's state as of the step just completed is saved
        (a checkpoint written and closed), as step; one member calls it,
        between two steps."""
        self._call(pb.COLLECTIVE_SAVED, step=step)

    def steps(self, port, k=1):
        """The port's items as steps, in lockstep with the group's other
        members (a group kind's replica): every member gets the same
        number of steps; a step hands each member up to k items (it waits
        for k, or for the end of its input); a member whose input has
        ended gets empty steps while another's has not, so that it still
        joins the step's collectives (DDP's all-reduce in backward, with a
        weight of zero); and the steps end on every member after the same
        step, once no member has an item left. Whether the members have
        items is settled by one all_reduce a step through dflow's group.

        Each step is a Step: items (a list), index (from 0, the same on
        every member), total (items over every member this step), members
        (how many took part). A member's share of a mean over the step's
        items is len(items)/total; with DDP, which averages gradients over
        the members, scale the sum of the member's losses by
        members/total. Items that came by reference are valid until the
        next step.

        Each step is measured, as node metrics (counters, in seconds):
        data_wait_seconds, the member's wait for its items, and
        compute_seconds, from having the step to asking for the next. The
        step's all_reduce, where the members wait for the last to arrive,
        is shared between the two in the proportion of the group's item
        waits to its compute (summed over the members in the same
        all_reduce): a group waiting for its producers counts it as data
        wait, one whose members compute unevenly as compute. dflow's
        report and its diagnosis read their shares."""
        if k < 1:
            raise ValueError("steps of %d items: k is at least 1" % k)
        held, ended, index = [], False, 0
        computed = 0.0  # the last step's compute
        while True:
            items = []
            asked = time.monotonic()  # the wait for the step's items begins
            while not ended and len(items) < k:
                # The first ask of a step gives back the last step's regions.
                item = self._take(port, held if not items else [], held)
                if item is None:
                    ended = True
                else:
                    items.append(item)
            got = time.monotonic()
            (total, waits, computes), members = self.all_reduce([len(items), got - asked, computed])
            ready = time.monotonic()
            data = waits / (waits + computes) if waits + computes > 0 else 1.0
            self.metric(DATA_WAIT, got - asked + data * (ready - got), counter=True)
            self.metric(COMPUTE, (1 - data) * (ready - got), counter=True)
            if total == 0:
                return
            yield Step(index, items, int(total), members)
            computed = time.monotonic() - ready
            self.metric(COMPUTE, computed, counter=True)
            index += 1
