"""Decode throughput: loaderlib's libjpeg-turbo kernels vs OpenCV, side by side in one run.

What it measures (images/s, median of interleaved rounds, all inputs in memory):
  1. full-image decode: ``cv2.imdecode`` (BGR) and ``cv2.imdecode`` + ``cvtColor`` to RGB in one
     thread and in a 2-thread pool, vs ``loaderlib.decode_batch`` (RGB) at 1 and 2 threads;
     scaling efficiency = rate(2 threads) / (2 x rate(1 thread));
  2. the decode a RandomResizedCrop(224) needs, one thread: full decode vs decoding only the
     crop box (crop-region decode) vs the crop box at the smallest DCT scale that still
     gives >= 224 px on both sides (crop + scale), boxes drawn like torchvision's
     RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)); and a fixed central 224x224 region;
  3. loaderlib's Huffman decoders (NOTE [ Our Huffman decoder ] in pyx/include/ll_huff.h, NOTE
     [ Progressive scans ] in pyx/include/ll_phuff.h) against libjpeg's own
     (``LOADERLIB_HUFFMAN=libjpeg``), one thread, switched between alternating rounds in one
     process: the full decode and the RandomResizedCrop boxes of 2, as the median of the
     per-round ratios; then the same images encoded progressive (libjpeg's standard script, as
     OpenCV and Pillow write them).

Run:  python benchmarks/decode.py [--images N] [--rounds R]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from _report import machine_summary, med, median_rate
from _synth import encode_jpeg, photo_like

import loaderlib as ll
from loaderlib._ext import _jpeg
from loaderlib.transforms import random_resized_crop_box

# An ImageNet-like mix of sizes (ImageNet's median image is about 500x375).
SIZES = [(500, 375), (375, 500), (500, 333), (500, 400), (640, 480), (800, 600), (1024, 768), (400, 300)]


def make_images(sizes: list[tuple[int, int]]) -> list[bytes]:
    """Photo-like JPEGs of the given (width, height) sizes, qualities 75-95, 4:2:0/4:4:4/4:2:2
    (also the images of benchmarks/transforms.py)."""
    return [encode_jpeg(photo_like(w, h, seed=1000 + i), quality=(75, 85, 90, 95)[i % 4],
                        sampling=("420", "420", "444", "422")[i % 4]) for i, (w, h) in enumerate(sizes)]


def rrc_box(w: int, h: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params (scale=(0.08, 1), ratio=(3/4, 4/3)) as ``(x, y, w, h)``."""
    top, left, ch, cw = random_resized_crop_box(w, h, rng=rng)
    return left, top, cw, ch


def dct_denominator(cw: int, ch: int, size: int = 224) -> int:
    for d in (8, 4, 2):
        if math.ceil(cw / d) >= size and math.ceil(ch / d) >= size:
            return d
    return 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    data = make_images([SIZES[i % len(SIZES)] for i in range(args.images)])
    arrays = [np.frombuffer(d, np.uint8) for d in data]
    infos = [ll.jpeg_info(d) for d in data]
    n = len(data)
    print("loaderlib decode benchmark")
    print(machine_summary())
    mean_px = np.mean([i.width * i.height for i in infos])
    print(f"data: {n} photo-like JPEGs in memory, {len(SIZES)} sizes from 400x300 to 1024x768 "
          f"(mean {mean_px / 1e3:.0f} kpx, {np.mean([len(d) for d in data]) / 1e3:.0f} KB), quality 75-95, "
          f"4:2:0/4:2:2/4:4:4; {args.rounds} interleaved rounds, median images/s\n")

    pool = ThreadPoolExecutor(2)
    flags = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION

    def cv_bgr() -> int:
        for a in arrays:
            cv2.imdecode(a, flags)
        return n

    def cv_rgb() -> int:
        for a in arrays:
            cv2.cvtColor(cv2.imdecode(a, flags), cv2.COLOR_BGR2RGB)
        return n

    def cv_pool_bgr() -> int:
        list(pool.map(lambda a: cv2.imdecode(a, flags), arrays))
        return n

    def cv_pool_rgb() -> int:
        list(pool.map(lambda a: cv2.cvtColor(cv2.imdecode(a, flags), cv2.COLOR_BGR2RGB), arrays))
        return n

    # loaderlib decodes into caller-owned outputs (in the loader: the batch arena), reused
    # across rounds; cv2.imdecode allocates a new array per call. The "new arrays" row shows
    # loaderlib allocating per call too.
    outs = [np.empty((i.height, i.width, 3), np.uint8) for i in infos]

    def ll_threads(k: int):
        def run() -> int:
            ll.decode_batch(data, num_threads=k, out=outs)
            return n
        return run

    def ll_new_arrays() -> int:
        ll.decode_batch(data, num_threads=1)
        return n

    prev = cv2.getNumThreads()
    cv2.setNumThreads(1)  # imdecode is single-threaded anyway; keep OpenCV's pool out of it
    for f in (cv_bgr, cv_rgb, ll_threads(1), ll_threads(2)):  # warm up
        f()
    rates = median_rate(
        {
            "cv2.imdecode (BGR), 1 thread": cv_bgr,
            "cv2.imdecode + cvtColor RGB, 1 thread": cv_rgb,
            "loaderlib decode_batch (RGB), 1 thread": ll_threads(1),
            "loaderlib decode_batch (RGB, new arrays), 1T": ll_new_arrays,
            "cv2.imdecode (BGR), 2-thread pool": cv_pool_bgr,
            "cv2.imdecode + cvtColor RGB, 2-thread pool": cv_pool_rgb,
            "loaderlib decode_batch (RGB), 2 threads": ll_threads(2),
        },
        args.rounds,
    )
    cv2.setNumThreads(prev)
    m = {k: med(v) for k, v in rates.items()}
    base = m["cv2.imdecode (BGR), 1 thread"]
    print("1. full-image decode")
    print(f"   {'system':46s} {'images/s':>9s} {'vs cv2 1T':>9s}  (min..max over rounds)")
    for k, v in m.items():
        print(f"   {k:46s} {v:9.0f} {v / base:8.2f}x  ({min(rates[k]):.0f}..{max(rates[k]):.0f})")
    ll1 = m["loaderlib decode_batch (RGB), 1 thread"]
    ll2 = m["loaderlib decode_batch (RGB), 2 threads"]
    cvp = m["cv2.imdecode (BGR), 2-thread pool"]
    print(f"   single-thread: loaderlib / cv2.imdecode = {ll1 / base:.2f}x; "
          f"/ (cv2.imdecode + cvtColor) = {ll1 / m['cv2.imdecode + cvtColor RGB, 1 thread']:.2f}x")
    print(f"   2 threads: loaderlib / cv2 2-thread pool = {ll2 / cvp:.2f}x")
    print(f"   scaling efficiency at 2 threads: loaderlib {ll2 / (2 * ll1):.2f}, "
          f"cv2 pool {cvp / (2 * base):.2f}\n")

    # 2. RandomResizedCrop-style decodes, one thread.
    rng = np.random.default_rng(7)
    boxes = [rrc_box(i.width, i.height, rng) for i in infos]
    denoms = [dct_denominator(b[2], b[3]) for b in boxes]
    centre = [((i.width - 224) // 2, (i.height - 224) // 2, 224, 224) for i in infos]
    crop_scaled_out = [
        np.empty((math.ceil((b[1] + b[3]) / d) - b[1] // d, math.ceil((b[0] + b[2]) / d) - b[0] // d, 3), np.uint8)
        for b, d in zip(boxes, denoms)
    ]

    def full() -> int:
        ll.decode_batch(data, num_threads=1, out=outs)
        return n

    # Every variant decodes into outputs allocated once, as the loader's arena does.
    crop_out = [np.empty((b[3], b[2], 3), np.uint8) for b in boxes]
    centre_out = np.empty((n, 224, 224, 3), np.uint8)

    def crop_only() -> int:
        ll.decode_batch(data, crop=boxes, num_threads=1, out=crop_out)
        return n

    def crop_scaled() -> int:
        for d in (1, 2, 4, 8):
            idx = [k for k in range(n) if denoms[k] == d]
            if idx:
                ll.decode_batch([data[k] for k in idx], scale=1 / d, crop=[boxes[k] for k in idx],
                                num_threads=1, out=[crop_scaled_out[k] for k in idx])
        return n

    def centre224() -> int:
        ll.decode_batch(data, crop=centre, num_threads=1, out=centre_out)
        return n

    rates = median_rate({"full decode": full, "crop-region decode (RRC box)": crop_only,
                         "crop + DCT-scale decode (RRC box)": crop_scaled,
                         "crop-region decode (central 224x224)": centre224}, args.rounds)
    m = {k: med(v) for k, v in rates.items()}
    area = np.mean([b[2] * b[3] / (i.width * i.height) for b, i in zip(boxes, infos)])
    hist = {d: denoms.count(d) for d in (1, 2, 4, 8)}
    print("2. decode for RandomResizedCrop(224), 1 thread")
    print(f"   boxes: torchvision's distribution, mean area {area:.0%} of the image; "
          f"DCT scale used 1/1:{hist[1]} 1/2:{hist[2]} 1/4:{hist[4]} 1/8:{hist[8]} images")
    for k, v in m.items():
        print(f"   {k:46s} {v:9.0f} images/s  {v / m['full decode']:5.2f}x full decode")

    # 3. The Huffman decoders, switched in this process (same data, same outputs). Each round
    # times both back to back, in alternating order, and the ratio is taken per round: a
    # noisy machine slows both alike within a round.
    def timed(ours: bool, fn) -> float:
        _jpeg.set_huffman_decoder(ours)
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    prog = [encode_jpeg(photo_like(i.width, i.height, seed=1000 + k), quality=(75, 85, 90, 95)[k % 4],
                        sampling=("420", "420", "444", "422")[k % 4], progressive=True)
            for k, i in enumerate(infos)]
    prog_out = [np.empty((i.height, i.width, 3), np.uint8) for i in infos]

    def prog_full() -> int:
        ll.decode_batch(prog, num_threads=1, out=prog_out)
        return n

    def prog_crop() -> int:
        ll.decode_batch(prog, crop=boxes, num_threads=1, out=crop_out)
        return n

    print("\n3. Huffman decoding: loaderlib's decoder vs libjpeg's, 1 thread (same pixels; "
          f"{4 * args.rounds + 1} alternating rounds; progressive: {np.mean([len(d) for d in prog]) / 1e3:.0f} KB mean)")
    for what, fn in (("full decode", full), ("RRC box", crop_only), ("progressive, full", prog_full),
                     ("progressive, RRC box", prog_crop)):
        ratios, ours_rate, theirs_rate = [], [], []
        for r in range(4 * args.rounds + 1):
            if r % 2:
                a = timed(True, fn)
                b = timed(False, fn)
            else:
                b = timed(False, fn)
                a = timed(True, fn)
            ratios.append(b / a)
            ours_rate.append(n / a)
            theirs_rate.append(n / b)
        q = statistics.quantiles(ratios, n=4)
        print(f"   {what:20s} loaderlib's {med(ours_rate):6.0f} images/s, libjpeg's {med(theirs_rate):6.0f}: "
              f"{statistics.median(ratios):.2f}x (per-round ratios, quartiles {q[0]:.2f}-{q[2]:.2f})")
    _jpeg.set_huffman_decoder(None)


if __name__ == "__main__":
    main()
