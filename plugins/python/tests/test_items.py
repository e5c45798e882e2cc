"""The item codec (dflowplugin.items): each wire type's layout, both ways,
and the payloads it refuses."""

import struct
import unittest

import numpy as np

from dflowplugin import BadItem, Blob, Hidden, Tokens, decode, encode, pieces


def hidden(B, T, K, D, seq=7):
    n = B * T
    return Hidden(B, T, K, D, seq,
                  np.arange(B * T * K * D, dtype=np.float32).reshape(B, T, K, D) / 4,
                  np.arange(n, dtype=np.int32).reshape(B, T) + 100,
                  np.arange(n, dtype=np.int32).reshape(B, T) - 50)


class TestLayouts(unittest.TestCase):
    """The bytes encode writes are the wire type's layout
    (docs/plugins.md): little-endian int64 header, then the arrays."""

    def test_bytes(self):
        self.assertEqual(encode(b"abc"), ("bytes", b"abc"))
        self.assertEqual(encode(bytearray(b"abc")), ("bytes", b"abc"))

    def test_blob(self):
        typ, b = encode(Blob(3, 9, b"payload"))
        self.assertEqual(typ, "blob")
        self.assertEqual(b, struct.pack("<qq", 3, 9) + b"payload")

    def test_tokens(self):
        t = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
        typ, b = encode(Tokens(2, 2, 11, t))
        self.assertEqual(typ, "tokens")
        self.assertEqual(b, struct.pack("<qqq", 2, 2, 11) + t.astype("<i4").tobytes())

    def test_hidden(self):
        h = hidden(2, 3, 2, 4)
        typ, b = encode(h)
        self.assertEqual(typ, "hidden")
        self.assertEqual(len(b), 40 + 4 * (2 * 3 * 2 * 4 + 2 * 2 * 3))
        self.assertEqual(struct.unpack_from("<qqqqq", b), (2, 3, 2, 4, 7))
        self.assertEqual(b[40:40 + 4 * 48], h.hidden.astype("<f4").tobytes())

    def test_non_contiguous_arrays(self):
        # A transposed array goes in C order, as its shape reads.
        t = np.arange(6, dtype=np.int32).reshape(3, 2).T  # [2, 3], not C-contiguous
        _, b = encode(Tokens(2, 2, 0, t))
        self.assertEqual(b[24:], np.ascontiguousarray(t).tobytes())

    def test_pieces_join_to_encode(self):
        for item in (b"xyz", Blob(1, 2, b"data"), Tokens(1, 1, 5, np.array([[7, 8]], np.int32)), hidden(1, 2, 3, 2)):
            typ, parts = pieces(item)
            want_typ, want = encode(item)
            self.assertEqual(typ, want_typ)
            self.assertEqual(b"".join(bytes(memoryview(p).cast("B")) for p in parts), want)

    def test_unknown_type(self):
        with self.assertRaises(TypeError):
            encode(3.5)
        with self.assertRaises(TypeError):
            pieces("a string")


class TestRoundTrip(unittest.TestCase):
    def test_bytes(self):
        self.assertEqual(decode("bytes", bytearray(b"hello")), b"hello")

    def test_blob(self):
        got = decode("blob", bytearray(encode(Blob(-1, 1 << 40, b"\x00\xff"))[1]))
        self.assertEqual((got.replica, got.seq, got.data), (-1, 1 << 40, b"\x00\xff"))
        self.assertIsInstance(got.data, bytes)

    def test_blob_from_shared_memory_is_a_view(self):
        b = memoryview(bytearray(encode(Blob(0, 1, b"abcd"))[1]))
        got = decode("blob", b)
        self.assertIsInstance(got.data, memoryview)
        self.assertEqual(bytes(got.data), b"abcd")

    def test_tokens(self):
        t = np.array([[1, -2, 3], [2 ** 31 - 1, 0, -2 ** 31]], np.int32)
        got = decode("tokens", bytearray(encode(Tokens(2, 2, 4, t))[1]))
        self.assertEqual((got.B, got.T, got.seq), (2, 2, 4))
        np.testing.assert_array_equal(got.tokens, t)

    def test_hidden(self):
        h = hidden(2, 3, 2, 4)
        got = decode("hidden", bytearray(encode(h)[1]))
        self.assertEqual((got.B, got.T, got.K, got.D, got.seq), (2, 3, 2, 4, 7))
        np.testing.assert_array_equal(got.hidden, h.hidden)
        np.testing.assert_array_equal(got.tokens, h.tokens)
        np.testing.assert_array_equal(got.greedy, h.greedy)

    def test_empty_hidden(self):
        got = decode("hidden", bytearray(encode(hidden(0, 5, 2, 3))[1]))
        self.assertEqual(got.hidden.shape, (0, 5, 2, 3))

    def test_views_writable_over_bytearray(self):
        # Received as bytes, an item's arrays are the node's to change in place.
        got = decode("tokens", bytearray(encode(Tokens(1, 1, 0, np.array([[1, 2]], np.int32)))[1]))
        got.tokens[0, 0] = 9
        self.assertEqual(got.tokens[0, 0], 9)

    def test_views_read_only_over_bytes(self):
        got = decode("tokens", encode(Tokens(1, 1, 0, np.array([[1, 2]], np.int32)))[1])
        with self.assertRaises(ValueError):
            got.tokens[0, 0] = 9


class TestBadItems(unittest.TestCase):
    def test_short_headers(self):
        for typ, n in (("blob", 15), ("tokens", 23), ("hidden", 39)):
            with self.assertRaises(BadItem, msg=typ) as cm:
                decode(typ, bytearray(n))
            self.assertIn("shorter than its header", str(cm.exception))

    def test_sizes_against_header(self):
        b = bytearray(encode(Tokens(2, 2, 0, np.zeros((2, 3), np.int32)))[1])
        with self.assertRaises(BadItem):
            decode("tokens", b[:-4])
        with self.assertRaises(BadItem):
            decode("tokens", b + b"\0\0\0\0")
        h = bytearray(encode(hidden(1, 2, 1, 2))[1])
        with self.assertRaises(BadItem):
            decode("hidden", h[:-1])

    def test_negative_sizes(self):
        with self.assertRaises(BadItem):
            decode("tokens", bytearray(struct.pack("<qqq", -1, 0, 0)))
        with self.assertRaises(BadItem):
            decode("hidden", bytearray(struct.pack("<qqqqq", 1, 1, 1, -1, 0)))

    def test_unknown_encoding(self):
        with self.assertRaises(BadItem) as cm:
            decode("pictures", b"")
        self.assertIn("'pictures'", str(cm.exception))

    def test_is_a_value_error(self):
        self.assertTrue(issubclass(BadItem, ValueError))


if __name__ == "__main__":
    unittest.main()
