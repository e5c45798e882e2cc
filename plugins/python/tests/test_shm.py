"""Shared memory (dflowplugin.shm) over anonymous maps in place of dflow's
memfds: pool 1's allocator, and which items go by reference and how."""

import mmap
import unittest

import numpy as np

from dflowplugin import Blob, Hidden, decode
from dflowplugin.shm import _alloc_hidden, _by_reference, _Pools

SIZE = 1 << 16


def pools(threshold=1024):
    return _Pools([mmap.mmap(-1, SIZE), mmap.mmap(-1, SIZE)], threshold)


class TestAllocator(unittest.TestCase):
    def test_first_fit_aligned(self):
        p = pools()
        self.assertEqual(p.alloc(1), 0)
        self.assertEqual(p.alloc(65), 64)
        self.assertEqual(p.alloc(0), 192)  # an empty item still takes a region
        self.assertEqual(p.live, {0: 64, 64: 128, 192: 64})

    def test_full(self):
        p = pools()
        self.assertEqual(p.alloc(SIZE), 0)
        self.assertIsNone(p.alloc(1))

    def test_release_merges(self):
        p = pools()
        a, b, c = p.alloc(100), p.alloc(100), p.alloc(100)
        p.release(b)
        p.release(a)
        self.assertEqual(p.free[0], (0, 256))
        p.release(c)
        self.assertEqual(p.free, [(0, SIZE)])
        self.assertEqual(p.alloc(SIZE), 0)  # whole again

    def test_release_of_what_was_not_sent(self):
        p = pools()
        with self.assertRaises(ValueError) as cm:
            p.release(128)
        self.assertIn("did not send", str(cm.exception))


class TestByReference(unittest.TestCase):
    def test_small_items_go_as_bytes(self):
        self.assertIsNone(_by_reference(pools(threshold=1024), "out", Blob(0, 1, b"x" * 100)))
        self.assertIsNone(_by_reference(None, "out", Blob(0, 1, b"x" * 5000)))

    def test_copied_once_into_pool_1(self):
        p = pools()
        item = Blob(2, 3, bytes(range(256)) * 8)
        ref = _by_reference(p, "out", item)
        self.assertEqual((ref.port, ref.type, ref.size), ("out", "blob", 16 + 2048))
        self.assertEqual((ref.ref.pool, ref.ref.length), (1, 16 + 2048))
        got = decode("blob", memoryview(p.maps[1])[ref.ref.offset:ref.ref.offset + ref.ref.length])
        self.assertEqual((got.replica, got.seq, bytes(got.data)), (2, 3, item.data))

    def test_pool_full_goes_as_bytes(self):
        p = pools()
        p.alloc(SIZE)
        self.assertIsNone(_by_reference(p, "out", Blob(0, 0, b"x" * 4096)))

    def test_alloc_hidden_sent_in_place(self):
        p = pools()
        h = _alloc_hidden(p, 2, 4, 2, 32, seq=5)
        h.hidden[:] = 1.5
        h.tokens[:] = 7
        h.greedy[:] = 8
        off, size = h._region
        ref = _by_reference(p, "out", h)
        self.assertEqual((ref.ref.pool, ref.ref.offset, ref.ref.length), (1, off, size))
        got = decode("hidden", memoryview(p.maps[1])[off:off + size])
        self.assertEqual((got.B, got.T, got.K, got.D, got.seq), (2, 4, 2, 32, 5))
        self.assertTrue((got.hidden == 1.5).all() and (got.tokens == 7).all() and (got.greedy == 8).all())
        self.assertFalse(hasattr(h, "_region"))  # sent: dflow's until it releases it

    def test_alloc_hidden_without_pools(self):
        h = _alloc_hidden(None, 1, 2, 3, 4)
        self.assertIsInstance(h, Hidden)
        self.assertEqual((h.hidden.shape, h.tokens.shape, h.greedy.shape), ((1, 2, 3, 4), (1, 2), (1, 2)))
        self.assertFalse(hasattr(h, "_region"))

    def test_received_item_sent_on_in_place(self):
        p = pools()
        n = 16 + 4096
        p.maps[0][0:16] = np.array([1, 2], "<i8").tobytes()
        p.held[0] = n
        p.given.add(0)
        item = decode("blob", p.view[0][0:n])
        ref = _by_reference(p, "out", item)
        self.assertEqual((ref.ref.pool, ref.ref.offset, ref.ref.length), (0, 0, n))

    def test_received_item_no_longer_held(self):
        p = pools()
        n = 16 + 4096
        item = decode("blob", p.view[0][0:n])  # its region was released
        with self.assertRaises(ValueError) as cm:
            _by_reference(p, "out", item)
        self.assertIn("copy what you keep", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
