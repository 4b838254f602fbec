"""Does the verdict name the right stage? Seven injected bottlenecks, each measured several times.

Each scenario builds a real loaderlib DataLoader on the demo dataset with one bottleneck
injected, measures it with ``loaderlib.profiling.benchmark`` (a steady window of
``--seconds`` after warm-up) and prints the verdict. A run counts as *right* when the verdict
names the expected stage, as *not enough evidence* when the verdict says so (an allowed
answer on a noisy machine), and as *wrong* otherwise. The goal: no wrong answer, ever.

Scenarios:

- slow storage: every read of the dataset sleeps 6 ms (a slow disk or network file system);
  expected ``io``;
- slow Python step: a per-sample Python transform that waits 6 ms without holding the GIL
  (a blocking call); expected ``python``;
- GIL-holding step: a brightness jitter written row by row in Python (holds the GIL);
  expected ``python``;
- too few threads: the native decode chain on 1 thread of the machine's CPUs; expected
  ``decode``;
- slow model: a fast native loader consumed by a simulated 100 ms model step per batch of
  16; expected ``model``;
- very slow model: the same loader under a 300 ms model step, so that a 1 s window holds
  3-4 steady-state batches (as ``benchmark(loader, model_step=1.5, seconds=6)`` does): a
  10x-100x separation that the verdict must decide from a handful of batches; expected
  ``model``;
- slow storage, read-ahead: the native loader over latencyfs (``benchmarks/latencyfs.c``, 8 ms
  +-50% per file, page cache bypassed) with ``io_depth=2``, so storage limits it; expected
  ``io`` with the storage latency named in the summary (NOTE [ Storage in the verdict ]): a
  run counts as right only when the summary says "storage latency". ``--no-fuse`` leaves it out.

The machine's load is printed with the results (the check is meant to run on a busy one).
Each window length given to ``--seconds`` is run in turn (short windows test that the verdict
decides early when the separation is large, NOTE [ Verdict rules ]), and a table of right /
not enough evidence / wrong per scenario and window length ends the output, with the number
of batches in the windows.

Measured without a floor on the batches (NOTE [ Verdict rules ]: the interval alone decides),
2 CPUs shared with other jobs. ``--runs 3 --seconds 1 3`` (load average 3-10)::

                 scenario  window   batches   separation  right  not enough  wrong
 slow storage, read-ahead      1s   16-17     6.3-7.9  x      3           0      0
             slow storage      1s   10-12     4.8-6.2  x      3           0      0
         slow Python step      1s   14-15     2.6-4.4  x      3           0      0
         GIL-holding step      1s    9-12     2.2-2.8  x      3           0      0
          too few threads      1s   11-22     1.8-3.3  x      2           1      0
               slow model      1s   10-10     2.6-3.8  x      3           0      0
          very slow model      1s    4-4      6.6-9.6  x      3           0      0
 slow storage, read-ahead      3s   31-37     3.0-4.7  x      3           0      0
             slow storage      3s   13-18    11.2-17.8 x      3           0      0
         slow Python step      3s   21-23     1.9-2.9  x      3           0      0
         GIL-holding step      3s   12-22     2.1-3.6  x      3           0      0
          too few threads      3s   27-30     2.1-2.9  x      3           0      0
               slow model      3s   27-28     1.8-2.2  x      3           0      0
          very slow model      3s   10-10     4.9-5.6  x      3           0      0
    right 41 of 42, not enough evidence 1, wrong 0
    runs with a separation of at least 2x over at least 8 batches: 35, of which not enough evidence: 0
    runs with fewer than 6 batches (the former floor): 3, of which decided right: 3

``--runs 3 --seconds 0.5`` (load average 13)::

 slow storage, read-ahead    0.5s    6-8      9.7-13.8 x      3           0      0
             slow storage    0.5s    4-6      8.3-11.0 x      3           0      0
         slow Python step    0.5s    7-8      2.7-4.8  x      3           0      0
         GIL-holding step    0.5s    4-6      1.7-3.3  x      3           0      0
          too few threads    0.5s    9-12     1.9-3.1  x      2           1      0
               slow model    0.5s    5-5      1.9-2.8  x      3           0      0
          very slow model    0.5s    2-2      6.4-6.6  x      0           3      0
    right 17 of 21, not enough evidence 4, wrong 0
    runs with fewer than 6 batches (the former floor): 9, of which decided right: 6

The very slow model's 1 s windows (4 batches each) were "not enough evidence" with the former
floor of 6 batches; its 0.5 s windows hold 2 batches, too few for any interval to clear the
line (the t quantile at 1 degree of freedom is 31.8), and say to measure 3.

Usage::

    python benchmarks/verdict_check.py [--runs 3] [--seconds 1 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time

import numpy as np
from _latencyfs import mount
from loaderlib.profiling import benchmark, build_demo_dataset

import loaderlib as ll
from loaderlib import transforms as T


class SlowReads(ll.Dataset):
    """A dataset whose every read takes 6 ms more (a slow disk)."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        time.sleep(0.006)
        return self.base[i]


def blocking_step(img):
    time.sleep(0.006)  # a blocking call (I/O, a service): the GIL is released meanwhile
    return img


def brighter_row_by_row(img):
    out = np.empty_like(img)
    for y in range(img.shape[0]):
        out[y] = np.minimum(img[y] * 1.2, 255)
    return out


def scenarios(root, mounted=None):
    ds = ll.ImageFolderDataset(root)
    small = T.Compose([T.RandomResizedCrop(64), T.ToCHW()])
    extra = []
    if mounted is not None:
        extra.append(("slow storage, read-ahead", "io", 0.0,
                      lambda: ll.DataLoader(ll.ImageFolderDataset(mounted).transform_first(small), batch_size=16,
                                            shuffle=True, num_threads=2, seed=0, io_depth=2)))
    return extra + [
        ("slow storage", "io", 0.0,
         lambda: ll.DataLoader(SlowReads(ds.transform_first(small)), batch_size=16, shuffle=True, num_threads=2,
                               seed=0)),
        ("slow Python step", "python", 0.0,
         lambda: ll.DataLoader(ds.transform_first(T.Compose([T.RandomResizedCrop(64), blocking_step, T.ToCHW()])),
                               batch_size=16, shuffle=True, num_threads=2, seed=0)),
        ("GIL-holding step", "python", 0.0,
         lambda: ll.DataLoader(ds.transform_first(T.Compose([T.RandomResizedCrop(224), brighter_row_by_row,
                                                             T.ToCHW()])),
                               batch_size=16, shuffle=True, num_threads=2, seed=0)),
        ("too few threads", "decode", 0.0,
         lambda: ll.DataLoader(ds.transform_first(T.Compose([T.RandomResizedCrop(224), T.ToCHW()])),
                               batch_size=16, shuffle=True, num_threads=1, seed=0)),
        ("slow model", "model", 0.1,
         lambda: ll.DataLoader(ds.transform_first(small), batch_size=16, shuffle=True, num_threads=2, seed=0)),
        ("very slow model", "model", 0.3,
         lambda: ll.DataLoader(ds.transform_first(small), batch_size=16, shuffle=True, num_threads=2, seed=0)),
    ]


def separation(r, expected: str) -> float:
    """How far apart the answer is from the next one: the loader-alone rate over the model's (slow
    model), else the largest stage's share of thread time over the next one's."""
    if expected == "model":
        return r.ceiling_samples_per_s / r.samples_per_s if r.ceiling_samples_per_s and r.samples_per_s else 0.0
    shares = sorted(r.window.stage_share.values(), reverse=True)
    return shares[0] / shares[1] if shares[1] > 0 else float("inf")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, nargs="+", default=[1.0, 3.0],
                   help="lengths of the measured windows, each run in turn")
    p.add_argument("--no-fuse", action="store_true", help="leave out the latencyfs scenario")
    p.add_argument("--smoke", action="store_true",
                   help="one 0.5 s run per scenario on 64 images, exit status 0 whatever the verdicts (a check that "
                        "the script runs)")
    args = p.parse_args()
    if args.smoke:
        args.runs, args.seconds = 1, [0.5]

    n_images = 64 if args.smoke else 256
    root = build_demo_dataset(os.path.join(tempfile.gettempdir(), f"loaderlib-verdict-check-{n_images}"),
                              n_images=n_images, n_classes=4, progress=False)
    with contextlib.ExitStack() as stack:
        mounted = None if args.no_fuse else stack.enter_context(mount(str(root), latency_ms=8.0)).path
        return run(args, root, n_images, mounted)


def run(args, root, n_images: int, mounted: str | None) -> int:
    windows = ", ".join(f"{s:g}" for s in args.seconds)
    print(f"verdict check: {args.runs} runs x {len(scenarios(root, mounted))} injected bottlenecks x windows of "
          f"{windows} s, "
          f"demo dataset {root} ({n_images} JPEGs)")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({ll.available_cpus()} available), "
          f"Python {platform.python_version()}, load average before {os.getloadavg()[0]:.1f}")
    outcomes = ("right", "not enough evidence", "wrong")
    table: dict = {}
    for seconds in args.seconds:
        for name, expected, step, make in scenarios(root, mounted):
            row = table.setdefault((name, seconds), {"right": 0, "not enough evidence": 0, "wrong": 0,
                                                     "batches": [], "separation": [], "clear_undecided": 0,
                                                     "few": 0, "few_decided": 0})
            for run in range(1, args.runs + 1):
                loader = make()
                try:
                    r = benchmark(loader, model_step=step, seconds=seconds, replay=False)
                finally:
                    loader.close()
                v = r.verdict
                if not v.enough:
                    outcome = "not enough evidence"
                elif r.bottleneck == expected and ("read-ahead" not in name or "storage latency" in v.summary):
                    outcome = "right"
                else:
                    outcome = "wrong"
                row[outcome] += 1
                row["batches"].append(r.batches)
                sep = separation(r, expected)
                row["separation"].append(sep)
                row["clear_undecided"] += sep >= 2 and r.batches >= 8 and outcome == "not enough evidence"
                row["few"] += r.batches < 6
                row["few_decided"] += r.batches < 6 and outcome == "right"
                conf = f"{100 * v.confidence:.0f}%" if v.confidence is not None else "-"
                print(f"{name:>17} {seconds:g} s #{run}: expected {expected:<7} got {r.bottleneck!s:<7} {outcome:<19} "
                      f"({r.batches} batches, separation {sep:.1f}x, confidence {conf}, {r.samples_per_s:,.0f} samples/s, "
                      f"cores {r.cpu_cores_used:.2f}, "
                      f"others {r.other_cores if r.other_cores is not None else float('nan'):.2f}, "
                      f"load {os.getloadavg()[0]:.1f})")
                print(f"{'':>21}{v.summary}")
                print(f"{'':>21}try: {v.suggestion[:160]}{'...' if len(v.suggestion) > 160 else ''}")
                for n in v.notes:
                    print(f"{'':>21}note: {n[:160]}{'...' if len(n) > 160 else ''}")
    print(f"\n{'scenario':>17} {'window':>7} {'batches':>9} {'separation':>12} {'right':>6} {'not enough':>11} "
          f"{'wrong':>6}")
    total = {k: 0 for k in outcomes}
    clear = clear_undecided = few = few_decided = 0
    for (name, seconds), row in table.items():
        b, sep = row["batches"], row["separation"]
        print(f"{name:>17} {seconds:>6g}s {min(b):>4}-{max(b):<4} {min(sep):>5.1f}-{max(sep):<5.1f}x {row['right']:>6} "
              f"{row['not enough evidence']:>11} {row['wrong']:>6}")
        for k in outcomes:
            total[k] += row[k]
        clear += sum(1 for x, nb in zip(sep, b) if x >= 2 and nb >= 8)
        clear_undecided += row["clear_undecided"]
        few += row["few"]
        few_decided += row["few_decided"]
    n = sum(total.values())
    print(f"\nright {total['right']} of {n}, not enough evidence {total['not enough evidence']}, "
          f"wrong {total['wrong']}")
    print(f"runs with a separation of at least 2x over at least 8 batches: {clear}, of which not enough evidence: "
          f"{clear_undecided}")
    print(f"runs with fewer than 6 batches (the former floor): {few}, of which decided right: {few_decided}")
    return 1 if total["wrong"] and not args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
