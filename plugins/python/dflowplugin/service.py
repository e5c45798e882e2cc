"""dflow plugins in Python.

A plugin is an executable that speaks the dflow.plugin.v1 Node service
(plugins/proto/dflow.proto) over hashicorp/go-plugin's gRPC transport:
dflow starts it, reads one handshake line from its stdout, and connects.
This module is that transport, the Node service and the item codec, so
that a plugin is a few node classes and a call to serve():

    class Scale(Node):
        name = "scale"
        config = [Field("factor", "number", default=2.0)]

        def ports(self, config):
            return [Port("in", "any"), Port("out", output=True, same_as="in")]

        def run(self, r):
            for item in r.recv("in"):
                r.send("out", item)

    serve(Scale())

Needs grpcio, protobuf and numpy (Debian: python3-grpcio, python3-protobuf,
python3-numpy). The layouts of the wire types are in docs/plugins.md.
"""

import contextlib
import json
import math
import mmap
import os
import queue
import shutil
import struct
import sys
import tempfile
import threading
import time
import traceback
from concurrent import futures

import grpc
import numpy as np

import dflow_pb2 as pb

COOKIE_KEY, COOKIE = "DFLOW_PLUGIN_MAGIC_COOKIE", "dflow-node-plugin-v1"
CHUNK = 1 << 20  # payload bytes per Item message, as dflow sends them
INPUT_WINDOW = 8  # input items a replica holds at most per port (its credit)
GROUP_WINDOW = 2  # the same for a group kind's replica
OUTPUT_WINDOW = 64  # messages a replica queues for dflow before send blocks
# CONCURRENT, set before serve, says a node may compute in threads of its
# own while one of its recv or send calls waits: the plugin then does not
# tell dflow when its node waits (Waiting), and dflow's deadlock detector
# treats its stages as always able to move.
CONCURRENT = False


# --- items ---------------------------------------------------------------

class Blob:
    """synthetic_source items: replica, seq, data (bytes)."""

    def __init__(self, replica, seq, data):
        self.replica, self.seq, self.data = replica, seq, data


class Tokens:
    """text_reader batches: B rows of T+1 byte tokens (int32 [B, T+1])."""

    def __init__(self, B, T, seq, tokens):
        self.B, self.T, self.seq, self.tokens = B, T, seq, tokens


class Hidden:
    """target_forward items: hidden float32 [B, T, K, D] (K tapped layers),
    tokens and greedy int32 [B, T]."""

    def __init__(self, B, T, K, D, seq, hidden, tokens, greedy):
        self.B, self.T, self.K, self.D, self.seq = B, T, K, D, seq
        self.hidden, self.tokens, self.greedy = hidden, tokens, greedy


class BadItem(ValueError):
    pass


def decode(typ, b):
    """An item from its wire type and payload (docs/plugins.md). Arrays are
    numpy views of b: writable when b is a bytearray, as the payloads of
    items received as bytes are; read-only views of dflow's shared memory
    for items received by reference (then a blob's data is a memoryview,
    not bytes)."""
    if typ == "bytes":
        return bytes(b)
    if typ == "blob":
        if len(b) < 16:
            raise BadItem("blob item shorter than its header")
        replica, seq = struct.unpack_from("<qq", b)
        return Blob(replica, seq, b[16:] if isinstance(b, memoryview) else bytes(b[16:]))
    if typ == "tokens":
        if len(b) < 24:
            raise BadItem("tokens item shorter than its header")
        B, T, seq = struct.unpack_from("<qqq", b)
        if B < 0 or T < 0 or len(b) != 24 + 4 * B * (T + 1):
            raise BadItem("tokens item: sizes do not match the header")
        return Tokens(B, T, seq, np.frombuffer(b, "<i4", B * (T + 1), 24).reshape(B, T + 1))
    if typ == "hidden":
        if len(b) < 40:
            raise BadItem("hidden item shorter than its header")
        B, T, K, D, seq = struct.unpack_from("<qqqqq", b)
        n, m = B * T, B * T * K * D
        if min(B, T, K, D) < 0 or len(b) != 40 + 4 * (m + 2 * n):
            raise BadItem("hidden item: sizes do not match the header")
        hidden = np.frombuffer(b, "<f4", m, 40).reshape(B, T, K, D)
        tokens = np.frombuffer(b, "<i4", n, 40 + 4 * m).reshape(B, T)
        greedy = np.frombuffer(b, "<i4", n, 40 + 4 * (m + n)).reshape(B, T)
        return Hidden(B, T, K, D, seq, hidden, tokens, greedy)
    raise BadItem("unknown item encoding %r" % typ)


def pieces(item):
    """An item's wire type and the pieces of its payload, in order: the
    arrays as the memory they occupy (C order), not copied."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return "bytes", [item]
    if isinstance(item, Blob):
        return "blob", [struct.pack("<qq", item.replica, item.seq), item.data]
    if isinstance(item, Tokens):
        return "tokens", [struct.pack("<qqq", item.B, item.T, item.seq),
                          np.ascontiguousarray(item.tokens, "<i4")]
    if isinstance(item, Hidden):
        return "hidden", [struct.pack("<qqqqq", item.B, item.T, item.K, item.D, item.seq),
                          np.ascontiguousarray(item.hidden, "<f4"),
                          np.ascontiguousarray(item.tokens, "<i4"),
                          np.ascontiguousarray(item.greedy, "<i4")]
    raise TypeError("no wire encoding for %s" % type(item).__name__)


def _u8(piece):
    """A piece as a flat uint8 array over its memory (no copy)."""
    return np.frombuffer(piece if isinstance(piece, (bytes, bytearray, memoryview)) else memoryview(piece).cast("B"), np.uint8)


def encode(item):
    """An item's wire type and payload."""
    if isinstance(item, (bytes, bytearray)):
        return "bytes", bytes(item)
    if isinstance(item, Blob):
        return "blob", struct.pack("<qq", item.replica, item.seq) + bytes(item.data)
    if isinstance(item, Tokens):
        return "tokens", struct.pack("<qqq", item.B, item.T, item.seq) + \
            np.ascontiguousarray(item.tokens, "<i4").tobytes()
    if isinstance(item, Hidden):
        return "hidden", b"".join([
            struct.pack("<qqqqq", item.B, item.T, item.K, item.D, item.seq),
            np.ascontiguousarray(item.hidden, "<f4").tobytes(),
            np.ascontiguousarray(item.tokens, "<i4").tobytes(),
            np.ascontiguousarray(item.greedy, "<i4").tobytes()])
    raise TypeError("no wire encoding for %s" % type(item).__name__)


# --- what a plugin author writes ----------------------------------------

class Field:
    """A config attribute: type is string, number, int, bool, list(string)
    or list(number)."""

    def __init__(self, name, type, default=None, required=False, doc="", path=""):
        # path: "read" or "write" when the attribute names files the node
        # reads or writes (a dflow worker checks them against its roots)
        self.name, self.type, self.default = name, type, default
        self.required, self.doc, self.path = required, doc, path


class Port:
    """A port: an input unless output; same_as makes an output's type the
    type of the named input's edge."""

    def __init__(self, name, type="", output=False, same_as="", doc=""):
        self.name, self.type, self.output = name, type, output
        self.same_as, self.doc = same_as, doc


class Node:
    """A node kind. Subclasses set name, doc and config, and define ports
    (for a config) and run (one replica); check may return errors as
    (field, message) pairs. group = True makes it a group kind (protocol
    version 2): its replicas step together, each a process of its own
    started with the environment torchrun gives a rank (RANK, WORLD_SIZE,
    MASTER_ADDR, ...), with the group's collectives on the replica
    (barrier, all_reduce, steps, finish, saves, saved)."""

    name = ""
    doc = ""
    config = []
    group = False

    def ports(self, config):
        raise NotImplementedError

    def check(self, config):
        return []

    def run(self, replica):
        raise NotImplementedError


class _Pools:
    """dflow's shared memory for this replica (Start.pools): pool 0 holds
    what dflow sends (mapped read-only: received arrays view it), pool 1
    what this plugin sends, allocated here (first fit) and freed when dflow
    releases a region."""

    ALIGN = 64

    def __init__(self, m):
        self.threshold = max(m.threshold, 1)
        self.maps = []
        for fd, size, write in ((m.in_fd, m.in_size, False), (m.out_fd, m.out_size, True)):
            f = os.open("/proc/%d/fd/%d" % (m.pid, fd), os.O_RDWR if write else os.O_RDONLY)
            try:
                self.maps.append(mmap.mmap(f, size, mmap.MAP_SHARED,
                                           mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)))
            finally:
                os.close(f)
        self.view = [memoryview(mm) for mm in self.maps]
        self.arr = [np.frombuffer(mm, np.uint8) for mm in self.maps]
        self.base = [a.ctypes.data for a in self.arr]
        self.lock = threading.Lock()
        self.free = [(0, m.out_size)]  # pool 1's free spans, by offset
        self.live = {}  # pool 1's regions: offset -> size
        self.held = {}  # pool 0's regions this replica holds: offset -> length
        self.given = set()  # those whose item the node has been given (recv)

    def alloc(self, n):
        size = (max(n, 1) + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        with self.lock:
            for i, (off, m) in enumerate(self.free):
                if m >= size:
                    if m == size:
                        del self.free[i]
                    else:
                        self.free[i] = (off + size, m - size)
                    self.live[off] = size
                    return off
        return None

    def release(self, off):
        with self.lock:
            size = self.live.pop(off, None)
            if size is None:
                raise BadItem("dflow released pool 1's region at %d, which the plugin did not send" % off)
            self.free.append((off, size))
            self.free.sort()
            merged = []
            for o, m in self.free:
                if merged and merged[-1][0] + merged[-1][1] == o:
                    merged[-1] = (merged[-1][0], merged[-1][1] + m)
                else:
                    merged.append((o, m))
            self.free = merged

    def contiguous(self, pool, parts, size):
        """Where the pieces already lie in the pool, back to back, or None.
        A small piece (a header) not in place counts when the bytes in
        place equal it."""
        base, arr = self.base[pool], self.arr[pool]
        addrs, pos, start = [], 0, None
        for p in parts:
            u = _u8(p)
            addrs.append((u, u.ctypes.data if len(u) else 0))
        for u, a in addrs:
            if len(u) and base <= a < base + len(arr):
                start = a - base - pos
                break
            pos += len(u)
        if start is None or start < 0 or start + size > len(arr):
            return None
        pos = start
        for u, a in addrs:
            if len(u) and a != base + pos and (len(u) > 4096 or not np.array_equal(arr[pos:pos + len(u)], u)):
                return None
            pos += len(u)
        return start


class Replica:
    """One running replica, as Node.run sees it."""

    def __init__(self, start, config, out):
        self.stage, self.index, self.replicas = start.stage, start.replica, start.replicas
        self.device, self.config = start.device, config
        # group: the replica is a member of its stage's group (a group kind
        # served at protocol version 2), and has its collectives
        self.group = bool(getattr(start, "group", False))
        self._out = out
        self._results = queue.Queue()  # CollectiveResults from dflow
        self._collective = threading.Lock()  # one collective at a time
        self._next_id = 0
        self._inputs = {}
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
            if item is _EOF:
                return
            yield item

    def _take(self, port, drop, held):
        """The port's next item, or _EOF at its end: the node asks for it,
        which ends the item in hand and gives back the regions in drop (a
        list, emptied) as the item arrives; the new item's region, if it
        has one, is added to held."""
        q = self._inputs[port]
        self._times.next()  # the node asks for an item: the one in hand is done
        try:
            item = q.get_nowait()
        except queue.Empty:
            with self._watch.blocked(q.empty), self._times.wait(_IDLE):
                item = q.get()
        for off in drop:  # the previous items' regions go back to dflow
            self._drop(off)
        del drop[:]
        if item is _EOF:
            q.put(_EOF)  # and at every later ask
            self._times.none()
            return _EOF
        item, off = item
        if off is not None:  # the node has it: its bytes may go back by reference
            with self._pools.lock:
                self._pools.given.add(off)
            held.append(off)
        # The item is taken: credit for one more on this port.
        self._put(pb.Message(credit=pb.Credit(n=1, port=port)))
        return item

    # --- the group's collectives (a group kind's replica: self.group) ---

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
                if item is _EOF:
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
        n, m = B * T, B * T * K * D
        size = 40 + 4 * (m + 2 * n)
        p = self._pools
        off = p.alloc(size) if p is not None and size >= p.threshold else None
        if off is None:
            return Hidden(B, T, K, D, seq, np.empty((B, T, K, D), np.float32),
                          np.empty((B, T), np.int32), np.empty((B, T), np.int32))
        buf = p.maps[1]
        h = Hidden(B, T, K, D, seq,
                   np.frombuffer(buf, "<f4", m, off + 40).reshape(B, T, K, D),
                   np.frombuffer(buf, "<i4", n, off + 40 + 4 * m).reshape(B, T),
                   np.frombuffer(buf, "<i4", n, off + 40 + 4 * (m + n)).reshape(B, T))
        h._region = (off, size)
        return h

    def _by_reference(self, port, item):
        """The Item message that sends a large item by reference, or None
        (it goes as bytes): in place when it already lies in a pool (an
        item received, sent on; a region from alloc_hidden), otherwise
        copied once into a region of pool 1."""
        p = self._pools
        typ, parts = pieces(item)
        size = sum(_u8(x).nbytes for x in parts)
        if p is None or size < p.threshold:
            return None
        region = getattr(item, "_region", None)
        if region is not None and region[1] == size and p.contiguous(1, parts[1:], size - 40) == region[0] + 40:
            struct.pack_into("<qqqqq", p.maps[1], region[0], item.B, item.T, item.K, item.D, item.seq)
            del item._region  # sent: the region is dflow's until it releases it
            return pb.Item(port=port, type=typ, size=size, ref=pb.Ref(pool=1, offset=region[0], length=size))
        off = p.contiguous(0, parts, size)
        if off is not None:
            # Within no region the node holds: an item kept past its
            # lifetime, whose region rests, is free, or holds a later item
            # that the node has not been given yet.
            with p.lock:
                ok = any(o <= off and off + size <= o + n and o in p.given for o, n in p.held.items())
            if not ok:
                raise BadItem("the item lies in the memory of an item received by reference that the node no longer "
                              "holds (such an item is valid until the next item is asked for on its port: copy what you keep)")
            return pb.Item(port=port, type=typ, size=size, ref=pb.Ref(pool=0, offset=off, length=size))
        off = p.alloc(size)
        if off is None:
            return None
        dst, pos = p.arr[1], off
        for x in parts:
            u = _u8(x)
            dst[pos:pos + len(u)] = u
            pos += len(u)
        return pb.Item(port=port, type=typ, size=size, ref=pb.Ref(pool=1, offset=off, length=size))

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


# The node metrics of Replica.steps (report.DataWait and report.Compute
# in dflow): a step's wait for its data and its compute, in seconds.
DATA_WAIT, COMPUTE = "data_wait_seconds", "compute_seconds"


class Step:
    """One step of a group member's input (Replica.steps)."""

    def __init__(self, index, items, total, members):
        self.index, self.items, self.total, self.members = index, items, total, members


_EOF = object()
_DONE = object()


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


class _Watch:
    """Waiting (Start.waiting): tells dflow when the node is blocked in
    exactly one recv or send with nothing it can do by itself, so that
    dflow's deadlock detector can judge the stage (docs/runtime.md,
    "Deadlock"). A call about to block registers the condition that keeps
    it blocked; the sender, with everything the node sent before on the
    stream, says Waiting(seen), seen being how many of dflow's messages the
    receiver had applied when it found the call still blocked. The
    receiver counts a message only after applying it, under the same lock
    the sender reads the count and the condition under: if the condition
    held, nothing counted can release the call, and what can has not been
    counted, which dflow sees as its own count differing from seen."""

    def __init__(self, on, out):
        self.on, self.out = on, out
        self.lock = threading.Lock()
        self.recvd = 1  # Start
        self.waiters = []
        self.said = (False, 0)

    def _look(self):
        try:
            self.out.put_nowait(_LOOK)
        except queue.Full:
            pass  # the sender is busy: it looks once it has sent what is queued

    def received(self):
        if not self.on:
            return
        with self.lock:
            self.recvd += 1
            look = bool(self.waiters)
        if look:
            self._look()

    @contextlib.contextmanager
    def blocked(self, cond):
        if not self.on:
            yield
            return
        with self.lock:
            self.waiters.append(cond)
        self._look()
        try:
            yield
        finally:
            with self.lock:
                self.waiters.remove(cond)
            self._look()

    def waiting(self):
        """The Waiting message to send now, None when nothing changed."""
        if not self.on or not self.out.empty():
            return None
        with self.lock:
            seen = self.recvd
            waiting = len(self.waiters) == 1 and self.waiters[0]()
        if not waiting:
            seen = 0
        if (waiting, seen) == self.said:
            return None
        self.said = (waiting, seen)
        return pb.Message(waiting=pb.Waiting(waiting=waiting, seen=seen))


_LOOK = object()  # in the output queue: the sender looks at the node's waits

TIMES_EVERY = 0.1  # seconds: how often the sender says Times while they change
_IDLE, _BLOCKED = 0, 1


def _times_enabled():
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


# --- the service -----------------------------------------------------------

def _config(kind, config_json):
    """The config values, defaults filled in, and the field errors."""
    try:
        given = json.loads(config_json or "{}")
    except ValueError as e:
        return None, [("", "config is not JSON: %s" % e)]
    fields = {f.name: f for f in kind.config}
    errors = [(k, "unknown attribute") for k in given if k not in fields]
    config = {}
    for f in kind.config:
        if f.name in given:
            config[f.name] = given[f.name]
        elif f.required:
            errors.append((f.name, "required"))
        else:
            config[f.name] = f.default
    return config, errors


class _Service:
    def __init__(self, kinds):
        self.kinds = {k.name: k for k in kinds}

    def describe(self, request, context):
        resp = pb.DescribeResponse(batches=True, port_credit=True, output_credit=True,
                                   shared_memory=_shm_enabled(), waiting=not CONCURRENT,
                                   times=_times_enabled())
        for k in self.kinds.values():
            kind = resp.kinds.add(name=k.name, doc=k.doc, group=bool(k.group) and _VERSION >= 2)
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
        r._watch = _Watch(start.waiting and not CONCURRENT, out)
        ports = kind.ports(config)
        r._times = _Times(start.times, not any(not p.output for p in ports))
        # A group member holds few items per port: the members share their
        # input edges, and one that held credit for many would take items
        # the others are waiting for (its steps full while theirs are empty).
        window = GROUP_WINDOW if start.group else INPUT_WINDOW
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
            if not _shm_enabled():
                error = "shared memory is off in this plugin (DFLOW_PLUGIN_SHM=off)"
            else:
                try:
                    r._pools = _Pools(start.pools)
                except Exception as e:
                    error = "mapping dflow's pools: %s" % e
            yield pb.Message(attached=pb.Attached(error=error))
        # Credit per port (port_credit): dflow feeds each input as its
        # credit allows, so a node may read its inputs in any order.
        for name in r._inputs:
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


def _shm_enabled():
    return sys.platform.startswith("linux") and os.environ.get("DFLOW_PLUGIN_SHM", "").lower() != "off"


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
    _watch_parent()
    global _VERSION
    _VERSION = _version()
    svc = _Service(kinds)
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
