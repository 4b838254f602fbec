"""Cold epoch starts: the model's idle fraction over several short epochs vs one long epoch.

A loader that starts every epoch cold idles the model while its prefetch queue refills. This
benchmark measures that on the ResNet-50 training chain (RandomResizedCrop(224), flip,
Normalize, CHW float32), batch 64, against a simulated model whose step is 1.25x the
loader's steady batch time (measured first with an infinitely fast consumer), so a loader
that keeps up leaves the model idle only while the very first batches are made:

* "5 epochs x 640": one DataLoader over 640 images, iterated for five epochs;
* "1 epoch x 3200": the same 640 images listed five times, one epoch;
* "5 epochs x 640, cold": the first setup with warm epochs turned off (each epoch starts
  when ``iter()`` is called, as before), for comparison in the same run.

Both consume 3200 images and pay the same first fill; the difference is what the four epoch
boundaries cost. Idle fraction = time the model spent waiting in ``next()`` / wall time from
the first ``next()`` to the last batch's step. Rounds are interleaved; medians are printed.
Expected (issue 9): within 3 points of each other (before warm epochs: 22.8% vs 4.7%).

Images: the demo dataset (``python -m loaderlib bench`` builds and caches it) or ``--data``.

Usage::

    python benchmarks/epochs.py [--data DIR] [--rounds 3] [--threads N] [--ratio 1.25]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from _report import machine_summary, med

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 64


def _chain():
    from loaderlib import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(mean=MEAN, std=STD),
                      T.ToCHW()])


def _loader(paths, labels, threads):
    import loaderlib as ll

    ds = ll.ImageListDataset(paths, labels).transform_first(_chain())
    return ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=threads, last_batch="discard")


def _steady_batch_s(loader) -> float:
    """Seconds per batch with an infinitely fast consumer, after the first 3 batches."""
    t0 = None
    n = 0
    for k, _ in enumerate(loader):
        if k == 3:
            t0 = time.perf_counter()
        elif k > 3:
            n += 1
    return (time.perf_counter() - t0) / n


def _idle(loader, epochs: int, step_s: float) -> tuple[float, int]:
    """(idle fraction of the simulated model, batches) over ``epochs`` epochs."""
    waited = 0.0
    batches = 0
    start = None
    for _ in range(epochs):
        it = iter(loader)
        while True:
            t = time.perf_counter()
            if start is None:
                start = t
            try:
                next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            batches += 1
            end = time.perf_counter() + step_s   # the model's step (a GPU would not hold the GIL)
            time.sleep(step_s)
            while time.perf_counter() < end:
                pass
    return waited / (time.perf_counter() - start), batches


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", help="image folder; default: the cached demo dataset")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--ratio", type=float, default=1.25, help="model step / loader batch time (default 1.25)")
    args = p.parse_args()

    from loaderlib.profiling import build_demo_dataset

    import loaderlib as ll
    from loaderlib._threads import available_cpus

    root = args.data or str(build_demo_dataset())
    items = ll.ImageFolderDataset(root).items
    if len(items) < 640:
        items = (items * (640 // len(items) + 1))
    items = items[:640]
    paths = [p for p, _ in items]
    labels = [lab for _, lab in items]
    threads = args.threads or available_cpus()
    short = _loader(paths, labels, threads)
    long = _loader(paths * 5, labels * 5, threads)
    _steady_batch_s(long)                       # warm the page cache
    batch_s = med([_steady_batch_s(long) for _ in range(2)])
    step = args.ratio * batch_s

    print(machine_summary())
    print(f"data: 640 images ({len(set(paths))} distinct) from {root}; batch {BATCH}; {threads} threads; ResNet-50 train chain, float32 CHW")
    print(f"loader steady batch time {1e3 * batch_s:.1f} ms ({BATCH / batch_s:.0f} img/s); simulated model step "
          f"{1e3 * step:.1f} ms ({args.ratio}x); {args.rounds} interleaved rounds\n")
    cold = _loader(paths, labels, threads)
    cold._warm_epochs = False
    res = {"5 epochs x 640": [], "1 epoch x 3200": [], "5 epochs x 640, cold": []}
    for _ in range(args.rounds):
        res["5 epochs x 640"].append(_idle(short, 5, step)[0])
        res["1 epoch x 3200"].append(_idle(long, 1, step)[0])
        res["5 epochs x 640, cold"].append(_idle(cold, 5, step)[0])
    for name, xs in res.items():
        print(f"{name:<22} model idle " + "  ".join(f"{100 * x:5.1f}%" for x in xs) + f"   median {100 * med(xs):5.1f}%")
    gap = 100 * (med(res["5 epochs x 640"]) - med(res["1 epoch x 3200"]))
    print(f"\ndifference: {gap:+.1f} points (expected within 3)")
    short.close()
    long.close()
    cold.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
