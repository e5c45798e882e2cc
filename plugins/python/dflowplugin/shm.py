"""Shared memory: large items by reference (Start.pools). dflow maps two
pools per replica and tells the plugin where they are; an item of
threshold bytes or more then goes as a Ref to its region instead of its
bytes, in either direction."""

import mmap
import os
import struct
import sys
import threading

import numpy as np

from . import dflow_pb2 as pb
from .items import BadItem, Hidden, _u8, pieces


def _enabled():
    return sys.platform.startswith("linux") and os.environ.get("DFLOW_PLUGIN_SHM", "").lower() != "off"


class _Pools:
    """dflow's shared memory for this replica (Start.pools): pool 0 holds
    what dflow sends (mapped read-only: received arrays view it), pool 1
    what this plugin sends, allocated here (first fit) and freed when dflow
    releases a region."""

    ALIGN = 64

    def __init__(self, maps, threshold):
        """The pools over maps, pool 0's and pool 1's (mmap objects or any
        writable buffer for pool 1); items of threshold bytes and more go
        by reference."""
        self.threshold = max(threshold, 1)
        self.maps = list(maps)
        self.view = [memoryview(mm) for mm in self.maps]
        self.arr = [np.frombuffer(mm, np.uint8) for mm in self.maps]
        self.base = [a.ctypes.data for a in self.arr]
        self.lock = threading.Lock()
        self.free = [(0, len(self.maps[1]))]  # pool 1's free spans, by offset
        self.live = {}  # pool 1's regions: offset -> size
        self.held = {}  # pool 0's regions this replica holds: offset -> length
        self.given = set()  # those whose item the node has been given (recv)

    @classmethod
    def map(cls, m):
        """Maps the pools dflow offers in Start.pools (its memfds, through
        /proc): pool 0 read-only, pool 1 read-write."""
        maps = []
        try:
            for fd, size, write in ((m.in_fd, m.in_size, False), (m.out_fd, m.out_size, True)):
                f = os.open("/proc/%d/fd/%d" % (m.pid, fd), os.O_RDWR if write else os.O_RDONLY)
                try:
                    maps.append(mmap.mmap(f, size, mmap.MAP_SHARED,
                                          mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)))
                finally:
                    os.close(f)
        except Exception:
            for mm in maps:
                mm.close()
            raise
        return cls(maps, m.threshold)

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


def _alloc_hidden(p, B, T, K, D, seq=0):
    """Replica.alloc_hidden over the replica's pools p (None without
    shared memory). A Hidden item to fill and send: its arrays (hidden float32
    [B, T, K, D], tokens and greedy int32 [B, T]) view a region of the
    plugin's shared memory laid out as the item goes on the wire, so
    that send passes it to dflow with no copy. Without shared memory
    (or with the pool full) they are ordinary arrays. Send it once; a
    region allocated and never sent is freed when the replica ends."""
    n, m = B * T, B * T * K * D
    size = 40 + 4 * (m + 2 * n)
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


def _by_reference(p, port, item):
    """Over the replica's pools p (None without shared memory): the Item
    message that sends a large item by reference, or None
    (it goes as bytes): in place when it already lies in a pool (an
    item received, sent on; a region from alloc_hidden), otherwise
    copied once into a region of pool 1."""
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
