"""Host-to-GPU hand-off: pinned vs pageable slot copies, and what ``ll.to_device`` overlaps.

Needs torch with CUDA; on a machine without it, prints that it skipped and exits 0.

Measures, on one GPU, with a ResNet-50-shaped float32 batch (256x3x224x224, 154 MB):

1. ``copy``: host-to-device copy bandwidth (GB/s) from a pageable numpy slot and from a pinned
   one (``DataLoader(pin_memory=True)`` allocates slots like this, once), timed with CUDA
   events over ``--repeat`` copies (median);
2. ``overlap``: an epoch of ``--batches`` loader batches (ArrayDataset, native engine) consumed
   by a simulated model step (a matmul loop sized to take about as long as one copy), with
   the copy done inline (``.to(device)`` then the step) vs through ``ll.to_device(loader,
   "cuda", prefetch=2)`` (copy of batch k+1 on a side stream during the step on batch k), for
   pageable and pinned slots. Wall time per batch, and the fraction of the copy hidden.

Usage::

    python benchmarks/device.py                    # 256x3x224x224 float32, 20 batches
    python benchmarks/device.py --batch 128 --batches 40 --dtype float16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--dtype", choices=("float32", "float16", "uint8"), default="float32")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("benchmarks/device.py: skipped (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print(f"benchmarks/device.py: skipped (torch {torch.__version__} sees no CUDA device on this machine)")
        return 0

    import loaderlib as ll

    dev = torch.device("cuda")
    shape = (args.batch, 3, args.size, args.size)
    nbytes = int(np.prod(shape)) * np.dtype(args.dtype).itemsize
    print(f"device: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
          f"batch {shape} {args.dtype} = {nbytes / 1e6:.0f} MB")

    # -- 1. copy bandwidth ------------------------------------------------------------------------
    pageable = torch.from_numpy(ll.arena.aligned_empty(shape, args.dtype))
    pinned = torch.empty(shape, dtype=pageable.dtype, pin_memory=True)
    for name, host in (("pageable", pageable), ("pinned", pinned)):
        times = []
        for _ in range(args.repeat + 1):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            host.to(dev, non_blocking=True)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000)
        t = statistics.median(times[1:])
        print(f"copy  {name:<9} {nbytes / t / 1e9:6.1f} GB/s  ({1000 * t:.2f} ms per batch, median of {args.repeat})")

    # -- 2. overlap with a simulated model step --------------------------------------------------
    x = torch.randn(4096, 4096, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        x @ x
    torch.cuda.synchronize()
    per_mm = (time.perf_counter() - t0) / 10
    t0 = time.perf_counter()
    pinned.to(dev)
    torch.cuda.synchronize()
    copy_t = time.perf_counter() - t0
    steps = max(1, round(copy_t / per_mm))

    def model(batch: torch.Tensor) -> None:
        for _ in range(steps):
            x @ x
        batch.sum()

    # One batch's worth of samples, visited args.batches times (the loader still gathers every
    # batch into a slot: the host side is real, only the dataset is small).
    data = np.ones((args.batch, *shape[1:]), args.dtype)
    labels = np.arange(len(data), dtype=np.int64)
    order = [i % args.batch for i in range(args.batch * args.batches)]

    def loader(pin: bool) -> ll.DataLoader:
        return ll.DataLoader(ll.ArrayDataset(data, labels), batch_size=args.batch, sampler=order, pin_memory=pin,
                             prefetch=2)

    for pin in (False, True):
        lo = loader(pin)
        list(lo)    # slots allocated (and pinned) before timing
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for xb, _ in lo:
            model(torch.from_numpy(xb).to(dev, non_blocking=pin))
        torch.cuda.synchronize()
        inline = (time.perf_counter() - t0) / args.batches
        dl = ll.to_device(loader(pin), "cuda", prefetch=2)
        list(dl)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for xb, _ in dl:
            model(xb)
        torch.cuda.synchronize()
        overlapped = (time.perf_counter() - t0) / args.batches
        hidden = (inline - overlapped) / copy_t if copy_t > 0 else 0.0
        print(f"overlap {'pinned' if pin else 'pageable':<9} step {steps} matmuls ~ one copy ({1000 * copy_t:.1f} ms): "
              f"inline {1000 * inline:.1f} ms/batch, to_device {1000 * overlapped:.1f} ms/batch "
              f"({100 * hidden:.0f}% of the copy hidden)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
