"""Exact vs fast JPEG decode (``fast=True``: libjpeg's fast integer IDCT and merged
upsampling, NOTE [ Fast decode ] in pyx/include/ll_jpeg.h), side by side in one run.

What it measures (images/s, median of interleaved rounds, one thread, all inputs in memory,
the photo-like JPEGs of benchmarks/decode.py):
  1. full-image decode: ``loaderlib.decode_batch`` into reused outputs, exact vs fast;
  2. the fused train chain Decode -> RandomResizedCrop(224) -> RandomHorizontalFlip ->
     Normalize -> ToCHW (float32), exact vs fast, with DCT scaling on (the default: the
     decoder's reduced-size IDCTs serve most crops, so fast=True changes only the
     upsampling there) and off (every crop region decoded at full size);
  3. the error of the fast full decode against the exact one over the same images: mean
     and max absolute difference in uint8 levels.

Run:  python benchmarks/fast_decode.py [--images N] [--rounds R]
"""

from __future__ import annotations

import argparse

import numpy as np
from _report import machine_summary, med, median_rate
from decode import SIZES, make_images

import loaderlib as ll
from loaderlib import transforms as T
from loaderlib._chain import compile_chain

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    data = make_images([SIZES[i % len(SIZES)] for i in range(args.images)])
    infos = [ll.jpeg_info(d) for d in data]
    n = len(data)
    print("loaderlib fast decode benchmark (exact vs fast=True)")
    print(machine_summary())
    print(f"data: {n} photo-like JPEGs in memory, {len(SIZES)} sizes from 400x300 to 1024x768 "
          f"(mean {np.mean([i.width * i.height for i in infos]) / 1e3:.0f} kpx), quality 75-95, "
          f"4:2:0/4:2:2/4:4:4; 1 thread; {args.rounds} interleaved rounds, median images/s\n")

    outs = [np.empty((i.height, i.width, 3), np.uint8) for i in infos]

    def decode(fast: bool):
        def run() -> int:
            ll.decode_batch(data, num_threads=1, out=outs, fast=fast)
            return n
        return run

    def chain(fast: bool, dct_scaling: bool = True):
        plan = compile_chain(T.Compose([T.Decode(fast=fast, dct_scaling=dct_scaling), T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                        T.Normalize(MEAN, STD), T.ToCHW()]))
        out = np.empty((n, *plan.sample_shape), plan.dtype)
        idx = np.arange(n)
        epoch = [0]

        def run() -> int:
            epoch[0] += 1  # both contenders see the same boxes round by round
            plan.run_buffers_into(data, out, idx, seed=0, epoch=epoch[0], num_threads=1)
            return n
        return run

    fns = {
        "decode_batch, exact (default)": decode(False),
        "decode_batch, fast=True": decode(True),
        "train chain, Decode()": chain(False),
        "train chain, Decode(fast=True)": chain(True),
        "train chain, no DCT scaling, exact": chain(False, False),
        "train chain, no DCT scaling, fast": chain(True, False),
    }
    for f in fns.values():  # warm up
        f()
    rates = median_rate(fns, args.rounds)
    m = {k: med(v) for k, v in rates.items()}
    print(f"   {'what':36s} {'images/s':>9s} {'speed-up':>9s}  (min..max over rounds)")
    names = list(m)
    for j, (k, v) in enumerate(m.items()):
        base = m[names[j - j % 2]]  # each fast row against the exact row above it
        print(f"   {k:36s} {v:9.0f} {v / base:8.2f}x  ({min(rates[k]):.0f}..{max(rates[k]):.0f})")

    total, count, worst = 0, 0, 0
    for d in data:
        diff = np.abs(ll.decode(d, fast=True).astype(np.int16) - ll.decode(d))
        total += int(diff.sum())
        count += diff.size
        worst = max(worst, int(diff.max()))
    print(f"\nfast vs exact full decode over these {n} images: mean abs error {total / count:.3f} levels, "
          f"max {worst} levels (of 255)")


if __name__ == "__main__":
    main()
