"""The replica: one running replica of a node kind, as Node.run sees it
(recv, send, metric; a group member's collectives come from Group)."""

import queue
import threading

from . import dflow_pb2 as pb
from .groups import Group
from .items import encode
from .shm import _alloc_hidden, _by_reference
from .times import _BLOCKED, _IDLE, _Times
from .waiting import _Watch

CHUNK = 1 << 20  # payload bytes per Item message, as dflow sends them


class Replica(Group):
    """One running replica, as Node.run sees it."""

    def __init__(self, start, config, out):
        self.stage, self.index, self.replicas = start.stage, start.replica, start.replicas
        self.device, self.config = start.device, config
        self._group_init(getattr(start, "group", False))
        # restore_step: a member of a kind that restores (Node.restores),
        # started again after its group was lost whole: restore the
        # group's save of this step and train on what comes after it
        # (-1: nothing was saved yet, start afresh); None on a first start
        has = getattr(start, "HasField", None)
        self.restore_step = start.restore_step if has is not None and has("restore_step") else None
        self._out = out
        self._inputs = {}
        # _on_demand (a kind that restores): credit for one item at a time,
        # granted only as the node asks for one, so that the item dflow
        # holds in hand is the one the node trains in the group's step
        # (its inputs are settled by the save of that step)
        self._on_demand = False
        self._credit = {}  # output port: dflow's credit (Start.output_credit)
        self._lock = threading.Lock()
        self._pools = None  # shared memory, when dflow offered it and it mapped
        self._watch = _Watch(False, out)
        self._times = _Times(False, False)

    def _put(self, m):
        """Queues a message for dflow; a wait for room is the node's blocked
        time."""
        try:
            self._out.put_nowait(m)
        except queue.Full:
            with self._times.wait(_BLOCKED):
                self._out.put(m)

    def recv(self, port):
        """The items arriving on an input port, until every producer has
        finished. An item that came by reference (shared memory) views
        dflow's pool, read-only: it is valid until the next item is asked
        for on this port, unless it is sent on before (then it goes back to
        dflow with no copy); copy what you keep (np.array(a))."""
        held = []
        while True:
            item = self._take(port, held, held)
            if item is None:
                return
            yield item

    def _take(self, port, drop, held):
        """The port's next item, or None at its end: the node asks for it,
        which ends the item in hand and gives back the regions in drop (a
        list, emptied) as the item arrives; the new item's region, if it
        has one, is added to held."""
        q = self._inputs[port]
        self._times.next()  # the node asks for an item: the one in hand is done
        try:
            item = q.get_nowait()
        except queue.Empty:
            if self._on_demand:
                self._put(pb.Message(credit=pb.Credit(n=1, port=port)))
            with self._watch.blocked(q.empty), self._times.wait(_IDLE):
                item = q.get()
        for off in drop:  # the previous items' regions go back to dflow
            self._drop(off)
        del drop[:]
        if item is _EOF:
            q.put(_EOF)  # and at every later ask
            self._times.none()
            return None
        item, off = item
        if off is not None:  # the node has it: its bytes may go back by reference
            with self._pools.lock:
                self._pools.given.add(off)
            held.append(off)
        # The item is taken: credit for one more on this port (on demand:
        # at the next ask).
        if not self._on_demand:
            self._put(pb.Message(credit=pb.Credit(n=1, port=port)))
        return item

    def _drop(self, off):
        p = self._pools
        with p.lock:
            length = p.held.pop(off)
            p.given.discard(off)
        self._put(pb.Message(release=pb.Release(refs=[pb.Ref(pool=0, offset=off, length=length)])))

    def alloc_hidden(self, B, T, K, D, seq=0):
        """A Hidden item to fill and send: its arrays (hidden float32
        [B, T, K, D], tokens and greedy int32 [B, T]) view a region of the
        plugin's shared memory laid out as the item goes on the wire, so
        that send passes it to dflow with no copy. Without shared memory
        (or with the pool full) they are ordinary arrays. Send it once; a
        region allocated and never sent is freed when the replica ends."""
        return _alloc_hidden(self._pools, B, T, K, D, seq)

    def _by_reference(self, port, item):
        """The Item message that sends a large item by reference, or None
        (it goes as bytes): shm._by_reference over this replica's pools."""
        return _by_reference(self._pools, port, item)

    def send(self, port, item):
        """Sends an item on an output port, in chunks of at most CHUNK
        bytes, the first giving the whole size. It waits for dflow's
        credit on the port, so that a full edge holds back this port's
        items only."""
        if not self._inputs:
            self._times.next()  # a source's sends delimit its items
        credit = self._credit.get(port)
        if credit is not None and not credit.try_take():
            with self._watch.blocked(credit.none), self._times.wait(_BLOCKED):
                credit.take()
        ref = self._by_reference(port, item)
        if ref is not None:
            self._put(pb.Message(item=ref))
            return
        typ, b = encode(item)
        view = memoryview(b)
        with self._lock:  # one item's chunks in a row
            for i in range(0, max(len(b), 1), CHUNK):
                chunk = pb.Item(port=port, type=typ, payload=bytes(view[i:i + CHUNK]),
                                more=i + CHUNK < len(b))
                if i == 0:
                    chunk.size = len(b)
                self._put(pb.Message(item=chunk))

    def metric(self, name, value, counter=False):
        """Sets a gauge, or adds to a counter."""
        self._put(pb.Message(metric=pb.Metric(name=name, value=value, counter=counter)))


_EOF = object()  # in an input's queue: the end of its items


class _Credit:
    """dflow's credit on one output port: send takes one, waiting for a
    grant while there is none."""

    def __init__(self):
        self._n, self._closed = 0, False
        self._cv = threading.Condition()

    def grant(self, n):
        with self._cv:
            self._n += n
            self._cv.notify_all()

    def try_take(self):
        with self._cv:
            if self._n > 0:
                self._n -= 1
                return True
            return False

    def none(self):
        return self._n == 0 and not self._closed

    def take(self):
        with self._cv:
            while self._n == 0 and not self._closed:
                self._cv.wait()
            if self._n == 0:
                raise BrokenPipeError("the stream to dflow is gone")
            self._n -= 1

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify_all()
