"""Packs at a capped resolution: what ``pack --max-side N --quality Q`` (and ``--raw-below``)
buys in loader throughput, and what it costs in bytes, packing time and image quality.

Data: the generated photos of the other loader benchmarks (``benchmarks/_photos.py``):
ImageNet-like sizes, qualities, subsamplings and sensor noise by default, or ``--data-kind
one-photo``, the clean crops of loaderlib's sample photo the benchmarks used before; or a folder
of your own with ``--data``. Its statistics are printed.

Per variant: the unpacked folder (``ImageFolderDataset``, the baseline), the same images as
records without a cap (``pack`` with no options: the file bytes), and packs at max-side 256 /
320 / 384 / 512 with quality 90 and 95, plus raw records at max-side 256 (``--raw-below`` above
every image). For each:

- pack time: ``ll.pack(..., num_threads=--threads)``, wall time of the whole call, and the
  bytes written;
- loader throughput and CPU: the ResNet-50 float training chain (``RandomResizedCrop(S)``, flip,
  ``Normalize``, ``ToCHW``; float32 CHW) at S = 224 and 160, ``batch_size=64``,
  ``num_threads=--threads``, consumed by an infinitely fast model (iterate and drop); each
  measurement builds a loader, runs one warm-up epoch, then times ``--epochs`` epochs (wall
  time, and the process's CPU time over all its threads, per image: on a machine shared with
  other work the CPU per image is the steadier figure of what an image costs). The
  variants alternate within each of ``--rounds`` rounds; a figure is the median over rounds and
  the ratio is the median of the per-round ratios to the unpacked folder measured in the
  same round;
- quality cost: the mean absolute difference, in levels of 255, between the uint8 crops
  (``RandomResizedCrop(S)`` + flip, same seed and epoch) of the variant and the crops of the
  original files decoded at full scale (``Decode(dct_scaling=False)``): the crops cover the
  same part of the picture (NOTE [ Original coordinates ] in pyx/include/ll_chain.h), so the
  difference is what the lower resolution and the re-encoding lose. The unpacked folder's
  own figure is the cost of the loader's DCT-scaled decode (NOTE [ DCT scale choice ]).

The machine may be shared: rounds interleave the variants and ratios are taken within a
round, so a slower stretch slows every variant alike.

Usage::

    python benchmarks/pack.py                      # 1,000 images, 2 threads, 3 rounds
    python benchmarks/pack.py --images 2000 --rounds 5 --epochs 3
    python benchmarks/pack.py --data ~/photos      # an image folder of your own
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _photos import add_data_kind, photos_for  # noqa: E402  (benchmarks/ on the path first)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = (224, 160)


def data_stats(root: str) -> str:
    import loaderlib as ll

    ds = ll.ImageFolderDataset(root)
    sizes = np.asarray([os.path.getsize(p) for p, _ in ds.items])
    infos = [ll.jpeg_info(open(p, "rb").read()) for p, _ in ds.items[:500]]
    dims = np.asarray([(j.width, j.height) for j in infos])
    return (f"{len(ds)} JPEGs in {len(ds.synsets)} classes under {root}: file size median {np.median(sizes) / 1e3:.0f} KB, "
            f"mean {sizes.mean() / 1e3:.0f} KB; width x height median {int(np.median(dims[:, 0]))}x"
            f"{int(np.median(dims[:, 1]))} (first 500)")


def variants() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [("records", {})]
    for side in (256, 320, 384, 512):
        for q in (90, 95):
            out.append((f"{side} q{q}", {"max_side": side, "quality": q}))
    out.append(("256 raw", {"max_side": 256, "raw_below": 1 << 40}))
    return out


def train_chain(size: int):
    from loaderlib import transforms as T

    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()])


def rate(ds, size: int, threads: int, epochs: int) -> tuple[float, float]:
    """Images/s over ``epochs`` warm epochs, and the process's CPU milliseconds per image (every
    thread's: what the images cost whatever else runs on the machine)."""
    from loaderlib import DataLoader

    loader = DataLoader(ds.transform_first(train_chain(size)), batch_size=64, shuffle=True, num_threads=threads,
                        seed=0)
    try:
        for _ in loader:   # warm-up epoch: arena slots touched, files in the page cache
            pass
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        for _ in range(epochs):
            for x, _ in loader:
                n += len(x)
        return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e3
    finally:
        loader.close()


def crops(ds, size: int, threads: int, exact: bool = False) -> np.ndarray:
    from loaderlib import DataLoader
    from loaderlib import transforms as T

    steps = [T.Decode(dct_scaling=False)] if exact else []
    chain = T.Compose([*steps, T.RandomResizedCrop(size), T.RandomHorizontalFlip()])
    loader = DataLoader(ds.transform_first(chain), batch_size=64, num_threads=threads, seed=7)
    try:
        return np.concatenate([x.copy() for x, _ in loader])
    finally:
        loader.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--data", default=None, help="an image folder (default: generated)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    add_data_kind(p)
    a = p.parse_args()

    from _report import machine_summary

    import loaderlib as ll

    root = photos_for(a, a.images, os.path.join(HERE, "out"))
    print(machine_summary())
    print("data:", data_stats(root))
    print(f"loader: RN50 float train chain (RandomResizedCrop(S), flip, Normalize, ToCHW), batch 64, "
          f"{a.threads} threads, {a.epochs} epochs after a warm-up epoch, {a.rounds} interleaved rounds; "
          "the machine may be shared with other work")
    out_dir = os.path.join(HERE, "out", f"packs-{zlib.crc32(os.path.abspath(root).encode()):08x}")
    os.makedirs(out_dir, exist_ok=True)
    folder = ll.ImageFolderDataset(root)
    bytes_in = sum(os.path.getsize(p) for p, _ in folder.items)
    dsets: dict[str, object] = {"folder": folder}
    info: dict[str, tuple[float, int]] = {"folder": (0.0, bytes_in)}
    for name, kw in variants():
        rep = ll.pack(root, os.path.join(out_dir, name.replace(" ", "-")), overwrite=True, progress=False,
                      num_threads=a.threads, **kw)
        info[name] = (rep.seconds, rep.bytes_out)
        dsets[name] = ll.RecordFileDataset(rep.shards[0][0])
        print(f"packed {name:9s}: {rep.seconds:6.1f} s ({rep.images / rep.seconds:,.0f} img/s), "
              f"{rep.bytes_out / 1e6:7.1f} MB ({rep.bytes_out / bytes_in:.2f}x the files)", flush=True)

    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    cpu_ratios: dict[tuple[str, int], list[float]] = {}
    for r in range(a.rounds):
        for size in SIZES:
            base = cbase = 1.0
            for name, ds in dsets.items():
                v, c = rate(ds, size, a.threads, a.epochs)
                rates.setdefault((name, size), []).append(v)
                cpus.setdefault((name, size), []).append(c)
                if name == "folder":
                    base, cbase = v, c
                ratios.setdefault((name, size), []).append(v / base)
                cpu_ratios.setdefault((name, size), []).append(cbase / c)
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[(n, 224)][-1]:,.0f}" for n in dsets), flush=True)

    cost: dict[tuple[str, int], float] = {}
    for size in SIZES:
        ref = crops(folder, size, a.threads, exact=True).astype(np.int16)
        for name, ds in dsets.items():
            cost[(name, size)] = float(np.abs(crops(ds, size, a.threads).astype(np.int16) - ref).mean())

    print()
    print("| variant | pack s | MB | img/s 224 | x folder | CPU ms/img 224 | x folder | img/s 160 | x folder | "
          "CPU ms/img 160 | x folder | MAD 224 | MAD 160 |")
    print("|---|" + "---:|" * 12)
    for name in dsets:
        secs, nbytes = info[name]
        row = [name, f"{secs:.1f}" if secs else "-", f"{nbytes / 1e6:.1f}"]
        for size in SIZES:
            key = (name, size)
            row += [f"{statistics.median(rates[key]):,.0f}", f"{statistics.median(ratios[key]):.2f}x",
                    f"{statistics.median(cpus[key]):.3f}", f"{statistics.median(cpu_ratios[key]):.2f}x"]
        row += [f"{cost[(name, s)]:.2f}" for s in SIZES]
        print("| " + " | ".join(row) + " |")
    print("\nx folder: the median over rounds of the ratio to the folder measured in the same round (for CPU, "
          "the folder's CPU per image over the variant's). CPU ms/img: the process's CPU time (all threads) "
          "per image while the epochs ran.")
    print("MAD: mean absolute difference (levels of 255) of the uint8 RandomResizedCrop + flip crops against the "
          "original files decoded at full scale, same seed.")


if __name__ == "__main__":
    main()
