"""The item codec: dflow's wire types as Python objects, and back.

A payload's layout is the wire type's (docs/plugins.md): little-endian
int64 header fields, then the arrays in C order. Blob, Tokens and Hidden
are what a node receives and sends on ports of those types; any other
type is bytes.
"""

import struct

import numpy as np


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
    """An item, or a message about one, that breaks the protocol's rules."""


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
