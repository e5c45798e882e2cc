"""Waiting (Start.waiting): what tells dflow's deadlock detector that a
node is blocked in exactly one recv or send with nothing it can do by
itself (docs/runtime.md, "Deadlock")."""

import contextlib
import queue
import threading

from . import dflow_pb2 as pb

_LOOK = object()  # in the output queue: the sender looks at the node's waits


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
