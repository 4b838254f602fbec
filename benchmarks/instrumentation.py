"""What per-stage instrumentation costs: throughput with the stage recorder on vs off.

For each engine, the same DataLoader runs whole epochs with ``loader.recorder.enabled``
True and False in alternating order (on, off, off, on, ...), so slow drift of the machine
hits both alike; each epoch is consumed by an infinitely fast model. Printed: images/s
per round, the median of each, the overhead ``1 - median(on) / median(off)`` and its
median over rounds paired (on and off run back to back), and, as a bound that noise on a
shared machine cannot blur, the measured cost of the recorder calls one batch makes
relative to the batch's time.
Expected: at most 2% (the recorder takes one short lock per batch, and the kernels read a
monotonic clock a few times per sample only when it is on).

Engines measured:
* native: ImageFolderDataset + RandomResizedCrop(224), flip, Normalize, CHW (per-sample
  clocks inside the nogil kernels);
* threads: the same files with a Python transform step (timed around each Python call).

Images: the demo dataset (``python -m loaderlib bench`` builds and caches it) or ``--data``.

Usage::

    python benchmarks/instrumentation.py [--data DIR] [--rounds 6] [--epochs-per-round 3] [--threads N]
                                        [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _report import machine_summary, med

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _epochs(loader, k: int) -> float:
    """Images/s over ``k`` full epochs (epoch starts included: both settings pay them alike)."""
    n = 0
    t0 = time.perf_counter()
    for _ in range(k):
        for images, _labels in loader:
            n += images.shape[0]
    return n / (time.perf_counter() - t0)


def _recorder_cost(batch_size: int, rounds: int = 20000) -> float:
    """Microseconds the recorder costs per batch (every call an engine makes for one batch)."""
    from loaderlib.profiling import StageRecorder

    rec = StageRecorder()
    rec.epoch_started(2, batch_size)
    per_sample = np.ones((batch_size, 3), np.int64)
    stage = {"read": 1, "decode": 2, "transform": 3, "collate": 4}
    t0 = time.perf_counter()
    for _ in range(rounds):
        rec.consumer_waited(1000)
        rec.queue_depth(1, 2)
        rec.producer_blocked(10)
        rec.queue_depth(2, 2)
        rec.batch_done(batch_size, stage, 1_000_000, 2, per_sample)
    return (time.perf_counter() - t0) / rounds * 1e6


def _python_flip(img: np.ndarray) -> np.ndarray:
    # A Python step that calls numpy on the whole image (releases the GIL for the copy).
    return np.ascontiguousarray(img[:, ::-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", help="image folder; default: the cached demo dataset")
    p.add_argument("--rounds", type=int, default=6, help="epochs per setting (default 6)")
    p.add_argument("--threads", type=int, default=None, help="loader threads (default: CPUs available)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs-per-round", type=int, default=3, help="epochs per measurement (default 3)")
    args = p.parse_args()

    from loaderlib.profiling import build_demo_dataset

    import loaderlib as ll
    from loaderlib import transforms as T
    from loaderlib._threads import available_cpus

    root = args.data or str(build_demo_dataset())
    threads = args.threads or available_cpus()
    folder = ll.ImageFolderDataset(root)
    native_chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                              T.Normalize(mean=MEAN, std=STD), T.ToCHW()])
    python_chain = T.Compose([T.RandomResizedCrop(224), _python_flip, T.Normalize(mean=MEAN, std=STD),
                              T.ToCHW()])
    setups = {
        "native": folder.transform_first(native_chain),
        "threads (Python step)": folder.transform_first(python_chain),
    }

    print(machine_summary())
    print(f"data: {len(folder)} images from {root}; batch {args.batch_size}; {threads} threads; "
          f"{args.rounds} rounds of {args.epochs_per_round} epochs per setting, interleaved\n")
    rows = []
    for name, ds in setups.items():
        loader = ll.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_threads=threads, seed=0)
        engine = loader.engine
        _epochs(loader, 1)  # warm the page cache and the pool
        rates = {True: [], False: []}
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for on in order:
                loader.recorder.enabled = on
                rates[on].append(_epochs(loader, args.epochs_per_round))
        loader.recorder.enabled = True
        _epochs(loader, 1)
        stats = loader.stats
        loader.close()
        on, off = med(rates[True]), med(rates[False])
        rows.append((name, engine, rates, on, off, stats))

    for name, engine, rates, on, off, stats in rows:
        print(f"{name} (engine {engine})")
        print("  recorder on : " + "  ".join(f"{x:8.1f}" for x in rates[True]) + f"   median {on:8.1f} images/s")
        print("  recorder off: " + "  ".join(f"{x:8.1f}" for x in rates[False]) + f"   median {off:8.1f} images/s")
        spread = (max(rates[False]) - min(rates[False])) / off
        paired = med([1 - a / b for a, b in zip(rates[True], rates[False])])
        print(f"  overhead {100 * (1 - on / off):+.2f}% of the medians, {100 * paired:+.2f}% paired by round "
              f"(round-to-round spread with it off: {100 * spread:.1f}%)")
        print(f"  what it recorded: busy {100 * stats.busy_fraction:.0f}%, "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in stats.stage_mean_ms.items() if v) + " per image\n")
    cost = _recorder_cost(args.batch_size)
    print(f"recorder calls for one batch of {args.batch_size} (batch_done with per-sample rows, consumer_waited, "
          f"producer_blocked, 2x queue_depth): {cost:.1f} us")
    for name, _engine, _rates, on, _off, _stats in rows:
        batch_ms = 1e3 * args.batch_size / on
        print(f"  {name}: {100 * cost / 1e3 / batch_ms:.3f}% of a {batch_ms:.1f} ms batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
