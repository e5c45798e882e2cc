"""The trip of one hidden-state item of specs/dflash-torch.hcl, part by
part, against one device-to-device copy of the same bytes.

An item ([B, T, K, D] float32 hidden states, with its tokens and greedy
tokens, as target_forward emits them: 8 x 64 x 3 x 128 in the spec) goes
from a PyTorch target on a device to a PyTorch drafter rank on a device:

  device to host   the target copies its hidden states into its output
                   buffer in dflow's shared memory (target.py:
                   torch.from_numpy(out.hidden).copy_(hidden))
  shared memory    dflow copies the item out of the target's pool as it
                   arrives, and into the drafter's pool as it sends it:
                   two copies of its bytes between shared mappings
  serialization    without shared memory (DFLOW_PLUGIN_SHM=off) the item
                   is encoded to bytes and decoded instead (dflowplugin's
                   encode and decode; gRPC's own copies not counted)
  host to device   the whole item onto the drafter's device, from the
                   read-only view of the pool
  drafter's take   what drafter.py moves: the sampled anchors' rows
                   (gathered on the host, then to the device)

Each is timed over many rounds (CUDA synchronized) and printed in
microseconds and as a multiple of one device-to-device copy of the item's
bytes. Without CUDA the "device" is the CPU: every copy is a host copy,
and it says so.

  python3 bench/gpu/torch_trip.py [--device cuda:0] [--rounds 200]
"""

import argparse
import mmap
import os
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "python"))
from dflowplugin import Hidden, decode, encode  # noqa: E402

B, T, K, D, A, P = 8, 64, 3, 128, 16, 4  # the spec's batches, taps and the drafter's anchors, block


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_trip: %s asked, but torch %s has no CUDA" % (dev, torch.__version__))
    if cuda:
        torch.cuda.set_device(dev)
        print("device %s: %s, torch %s" % (dev, torch.cuda.get_device_name(dev), torch.__version__))
    else:
        print("device cpu, torch %s: no CUDA, so every \"device\" copy below is a host copy" % torch.__version__)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    n, m = B * T, B * T * K * D
    size = 40 + 4 * (m + 2 * n)  # the item on the wire (dflowplugin.alloc_hidden's region)
    hidden = torch.randn(B, T, K, D, device=dev)
    # The target's pool 1 and the drafter's pool 0: shared mappings, as
    # dflow's memfd pools are; Go memory between them (dflow's copy).
    out_pool, in_pool = mmap.mmap(-1, size), mmap.mmap(-1, size)
    out_arr = np.frombuffer(out_pool, np.uint8)
    in_arr = np.frombuffer(in_pool, np.uint8)
    between = np.empty(size, np.uint8)
    out_hidden = np.frombuffer(out_pool, "<f4", m, 40).reshape(B, T, K, D)
    in_hidden = np.frombuffer(in_pool, "<f4", m, 40).reshape(B, T, K, D)
    in_hidden.flags.writeable = False  # the drafter maps pool 0 read-only
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")  # read, never written
    item = Hidden(B, T, K, D, 0, np.random.randn(B, T, K, D).astype(np.float32),
                  np.random.randint(0, 256, (B, T)).astype(np.int32), np.random.randint(0, 256, (B, T)).astype(np.int32))
    on_device = torch.empty(B, T, K, D, device=dev)
    d2d_dst = torch.empty_like(hidden)
    gen = torch.Generator().manual_seed(1)

    def d2h():
        torch.from_numpy(out_hidden).copy_(hidden)

    def shm():
        between[:] = out_arr
        in_arr[:] = between

    def serialization():
        typ, b = encode(item)
        decode(typ, bytearray(b))

    def h2d():
        on_device.copy_(torch.from_numpy(in_hidden))
        sync()

    def take():
        a = torch.randint(0, T - P, (B, A), generator=gen).numpy()
        rows = np.ascontiguousarray(in_hidden[np.arange(B)[:, None], a].reshape(B * A, K * D))
        torch.from_numpy(rows).to(dev)
        sync()

    def d2d():
        d2d_dst.copy_(hidden)
        sync()

    def us(fn):
        for _ in range(5):
            fn()
        sync()
        t = time.perf_counter()
        for _ in range(args.rounds):
            fn()
        sync()
        return 1e6 * (time.perf_counter() - t) / args.rounds

    base = us(d2d)
    print("one hidden-state item: %d bytes (hidden states %d x %d x %d x %d float32, tokens, greedy)" % (size, B, T, K, D))
    print("  %-48s %9.1f us" % ("device-to-device copy (the baseline)", base))
    trip = 0.0
    for name, fn, counted in (("device to host (into shared memory)", d2h, True),
                              ("shared memory (dflow's two copies)", shm, True),
                              ("host to device (the whole item)", h2d, True),
                              ("serialization instead of shared memory", serialization, False),
                              ("drafter's take (%d anchors' rows to the device)" % (B * A), take, False)):
        t = us(fn)
        if counted:
            trip += t
        print("  %-48s %9.1f us  %7.1fx the device-to-device copy" % (name, t, t / base))
    print("  %-48s %9.1f us  %7.1fx the device-to-device copy" % ("the trip (the first three)", trip, trip / base))


if __name__ == "__main__":
    main()
