"""Times (Start.times): where a node's time goes, busy, idle and blocked,
and its service time per item, as the plugin tells dflow."""

import contextlib
import math
import os
import threading
import time

from . import dflow_pb2 as pb

TIMES_EVERY = 0.1  # seconds: how often the sender says Times while they change
_IDLE, _BLOCKED = 0, 1


def _enabled():
    return os.environ.get("DFLOW_PLUGIN_TIMES", "").lower() != "off"


class _Times:
    """Times (Start.times): where the node's time goes, which dflow shows
    as the replica's busy, idle and blocked time and its service times
    (seen from dflow's side of the stream, a node that computes while it
    holds credit for more input looks as if it waited). Idle is the time
    the node waited in recv for an item, blocked the time it waited in send
    for dflow's credit or for room in the queue to dflow, busy the rest; an
    item's service time runs from the node getting it to its asking for
    the next on any port (a source's: from one send to the next), less its
    waits meanwhile. Waits may overlap (a node that receives and sends
    from two threads, or sends from several): each instant counts once,
    blocked while any send waits, else idle while any recv waits, else
    busy, so the three add up to the wall time and an item's service time
    is the busy time between its recv and the next (as the Go SDK counts
    them: when both kinds wait, the node holds an output it cannot pass
    on, and more input would not make it go faster). The sender says Times
    every TIMES_EVERY while anything changed, and once more before Done."""

    def __init__(self, on, source):
        self.on = on
        self.lock = threading.Lock()
        self.begin = time.monotonic_ns()
        self.n = [0, 0]  # waits in progress: idle, blocked
        self.since = 0  # when n last changed
        self.done = [0, 0]  # idle and blocked ns until then
        self.item = 0 if source else -1  # when the item in hand began; -1: none
        self.item_waited = 0
        self.service_sum, self.service = 0, {}
        self.changed, self.said = False, 0

    def _now(self):
        return time.monotonic_ns() - self.begin

    def _totals(self, now):
        """Idle and blocked ns as of now: the time since the last change
        counts once, blocked while any send waits, else idle while any recv
        waits."""
        idle, blocked = self.done
        if self.n[_BLOCKED]:
            blocked += now - self.since
        elif self.n[_IDLE]:
            idle += now - self.since
        return idle, blocked

    def _waited(self, now):
        return sum(self._totals(now))

    def _change(self, kind, d):
        now = self._now()
        self.done = list(self._totals(now))
        self.since = now
        self.n[kind] += d
        self.changed = True

    def next(self):
        """Ends the item in hand, if any, and begins the next: each recv, on
        any port (a source's send). A node that takes one item from each of
        k ports for a piece of work has k items, whose service times add
        up to its busy time, as dflow's built-in stages count them."""
        if not self.on:
            return
        with self.lock:
            now = self._now()
            if self.item >= 0:
                d = max(now - self.item - (self._waited(now) - self.item_waited), 0)
                self.service_sum += d
                b = _bucket(d)
                self.service[b] = self.service.get(b, 0) + 1
                self.changed = True
            self.item, self.item_waited = now, self._waited(now)

    def none(self):
        """No item came: takes back the one begun."""
        with self.lock:
            self.item = -1

    @contextlib.contextmanager
    def wait(self, kind):
        if not self.on:
            yield
            return
        with self.lock:
            self._change(kind, 1)
        try:
            yield
        finally:
            with self.lock:
                self._change(kind, -1)

    def message(self, final=False):
        """The Times to say now: None when nothing changed, or when the
        last was said under TIMES_EVERY ago (unless final, before Done)."""
        if not self.on:
            return None
        with self.lock:
            now = self._now()
            if not final and (not self.changed or now - self.said < TIMES_EVERY * 1e9):
                return None
            idle, blocked = self._totals(now)
            activity = pb.ACTIVITY_BLOCKED if self.n[_BLOCKED] else pb.ACTIVITY_IDLE if self.n[_IDLE] else pb.ACTIVITY_BUSY
            t = pb.Times(busy_ns=now - idle - blocked, idle_ns=idle, blocked_ns=blocked, now=activity,
                         service_ns=self.service_sum,
                         service=[pb.ServiceBucket(bucket=b, count=n) for b, n in self.service.items()])
            self.service_sum, self.service = 0, {}
            self.changed, self.said = False, now
        return pb.Message(times=t)


def _bucket(ns):
    """A service time's bucket (ServiceBucket): 0 under 1 microsecond,
    else floor(18 log2(microseconds)) + 1."""
    if ns < 1000:
        return 0
    return min(int(math.floor(18 * math.log2(ns / 1000.0))), 1 << 20) + 1
