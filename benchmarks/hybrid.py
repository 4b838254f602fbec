"""Hybrid pipelines: a native head (decode + RandomResizedCrop + flip) and a Python tail.

Two questions, each configuration in a fresh process, rounds interleaved, medians reported:

1. ``tail``: a pure-Python step of about ``--step-ms`` per image (a GIL-holding loop) after the
   native head. The threads engine runs the tail on a thread pool (GIL-bound: at most
   1/step images/s whatever the cores); ``num_workers=2`` runs it in worker processes, which
   can use every core. The ratio processes/threads is bounded by the cores' share left after
   decoding (about 1.38 on 2 cores with a 2 ms step).
2. ``cost``: what the native head costs inside a worker. The tail is the identity, so the CPU
   time of the whole process tree per image is decode + crop + flip + the worker plumbing.
   Compared: the native engine (no Python), workers running the fused native prefix (NOTE
   [ Native prefix in workers ]), and workers calling ``dataset[i]`` one sample at a time (the
   dataset wrapped in a plain Python class, the only path before the native prefix).

Usage::

    python benchmarks/hybrid.py                 # generated photo-like JPEGs (benchmarks/loader.py's)
    python benchmarks/hybrid.py --data DIR --images 2048 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from _photos import add_data_kind, photos_for

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 64


class _Spin:
    """A Python step that holds the GIL for ``loops`` iterations and returns the image as is."""

    def __init__(self, loops: int) -> None:
        self.loops = loops

    def __call__(self, img):
        x = 0
        for k in range(self.loops):
            x ^= k
        return img


class _Indexed:
    """Any Python dataset: the loader can only call ``dataset[i]``."""

    def __init__(self, ds) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]


def calibrate(step_ms: float) -> int:
    spin = _Spin(100_000)
    t0 = time.perf_counter()
    for _ in range(5):
        spin(None)
    per_loop = (time.perf_counter() - t0) / 5 / 100_000
    return max(1, int(step_ms / 1000 / per_loop))


def _tree_cpu() -> float:
    """CPU seconds of this process and its live children (worker processes)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    total = ru.ru_utime + ru.ru_stime
    try:
        import psutil

        for c in psutil.Process().children(recursive=True):
            try:
                t = c.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    except ImportError:
        pass
    return total


def child(kind: str, root: str, images: int, loops: int, threads: int) -> dict:
    import loaderlib as ll
    from loaderlib import transforms as T

    head = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    base = ll.ImageFolderDataset(root)
    if kind == "native":
        ds, kw = base.transform_first(T.Compose(head)), {"num_threads": threads}
    elif kind == "threads-tail":
        ds, kw = base.transform_first(T.Compose([*head, _Spin(loops)])), {"num_threads": threads}
    elif kind == "workers-tail":
        ds, kw = base.transform_first(T.Compose([*head, _Spin(loops)])), {"num_workers": threads}
    elif kind == "workers-prefix":
        ds, kw = base.transform_first(T.Compose([*head, _Spin(0)])), {"num_workers": threads}
    elif kind == "workers-getitem":
        ds, kw = _Indexed(base.transform_first(T.Compose([*head, _Spin(0)]))), {"num_workers": threads}
    else:
        raise ValueError(kind)
    loader = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, timeout=600, **kw)
    engine = loader.engine
    n = 0
    for _ in loader:               # one whole epoch first: start-up (workers, their plans, the first
        pass                       # touch of every buffer) is not counted, for any configuration
    it = iter(loader)
    t0, c0 = time.perf_counter(), _tree_cpu()
    epoch = 0
    while n < images:
        for x, _y in it:
            n += len(x)
            if n >= images:
                break
        else:
            epoch += 1
            it = iter(loader)
    wall, cpu = time.perf_counter() - t0, _tree_cpu() - c0
    loader.close()
    return {"engine": engine, "rate": n / wall, "cpu_ms": 1000 * cpu / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024)
    add_data_kind(p)
    p.add_argument("--images", type=int, default=2048, help="images per measurement, after a warm-up epoch")
    p.add_argument("--threads", type=int, default=2, help="threads (native, threads engine) or worker processes")
    p.add_argument("--step-ms", type=float, default=2.0, help="cost of the Python tail step per image")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind, root, images, loops, threads = a.child
        print(json.dumps(child(kind, root, int(images), int(loops), int(threads))))
        return

    from _report import machine_summary

    print(machine_summary())
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    loops = calibrate(a.step_ms)
    print(f"data: {root}; batch {BATCH}; {a.images} images per run after a warm-up epoch; {a.threads} threads or "
          f"workers; Python step {a.step_ms} ms ({loops} loop iterations); {a.repeat} interleaved rounds, medians")
    kinds = ["threads-tail", "workers-tail", "native", "workers-prefix", "workers-getitem"]
    runs: dict = {k: [] for k in kinds}
    for _ in range(a.repeat):
        for k in kinds:
            out = subprocess.run([sys.executable, __file__, "--child", k, root, str(a.images), str(loops),
                                  str(a.threads)], capture_output=True, text=True, check=True)
            runs[k].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def med(k: str, f: str) -> float:
        return statistics.median(r[f] for r in runs[k])

    print("\n== tail: native head + a Python step per image")
    for k in ("threads-tail", "workers-tail"):
        rounds = ", ".join(f"{r['rate']:,.0f}" for r in runs[k])
        print(f"  {k:<16} engine {runs[k][0]['engine']:<9} {med(k, 'rate'):8,.0f} img/s  (rounds: {rounds})")
    print(f"  processes / threads: {med('workers-tail', 'rate') / med('threads-tail', 'rate'):.2f}x")
    print("\n== cost: CPU-ms per image of decode + RandomResizedCrop(224) + flip (identity Python tail)")
    for k in ("native", "workers-prefix", "workers-getitem"):
        print(f"  {k:<16} engine {runs[k][0]['engine']:<9} {med(k, 'cpu_ms'):6.3f} CPU-ms/img  "
              f"{med(k, 'rate'):8,.0f} img/s")
    print(f"  in a worker, native prefix vs native engine: {med('workers-prefix', 'cpu_ms') / med('native', 'cpu_ms'):.2f}x "
          f"the CPU; dataset[i] in a worker: {med('workers-getitem', 'cpu_ms') / med('native', 'cpu_ms'):.2f}x")


if __name__ == "__main__":
    main()
