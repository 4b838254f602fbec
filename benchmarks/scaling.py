"""Thread scaling of the native engine on the ResNet-50 training pipeline.

Measures images/s of ``DataLoader(ImageFolderDataset(...).transform_first(RandomResizedCrop(224),
flip, Normalize, ToCHW), batch_size=64, num_threads=n)`` consumed by an infinitely fast model,
for each ``n`` in ``--threads``, and the scaling efficiency ``rate(n) / (n * rate(1))``. Each
setting runs in its own process (a fresh OpenMP pool), warms up one whole epoch (the arena's
slots are touched once), then measures ``--epochs`` epochs; the settings alternate in
``--repeat`` rounds and each figure is the median of its rounds, so a disturbance on a shared
machine hits every setting alike. On a machine with more cores than images per batch / 4 the
dataset is too small to keep the threads busy: use ``--make`` to generate more.

Usage::

    python benchmarks/scaling.py                       # 1 and 2 threads (or 1..cores)
    python benchmarks/scaling.py --threads 1,2,4,8,16 --make 4096 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def child(root: str, threads: int, epochs: int, variant: str) -> None:
    import time

    import loaderlib as ll
    from loaderlib import transforms as T

    steps = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    if variant == "float":
        steps += [T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.ToCHW()]
    ds = ll.ImageFolderDataset(root).transform_first(T.Compose(steps))
    loader = ll.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_threads=threads, last_batch="discard")
    for _ in loader:   # warm-up epoch
        pass
    t0, n = time.perf_counter(), 0
    for _ in range(epochs):
        for x, _y in loader:
            n += len(x)
    print(json.dumps({"rate": n / (time.perf_counter() - t0), "engine": loader.engine}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024, help="images to generate when --data is not given")
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1..cores, doubling)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variant", default="float", choices=("float", "uint8"))
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        root, threads, epochs, variant = a.child
        child(root, int(threads), int(epochs), variant)
        return

    from benchmarks._report import machine_summary
    from benchmarks.loader import make_dataset
    from loaderlib import available_cpus

    cores = available_cpus()
    if a.threads:
        counts = [int(t) for t in a.threads.split(",")]
    else:
        counts, n = [], 1
        while n < cores:
            counts.append(n)
            n *= 2
        counts.append(cores)
    root = a.data or make_dataset(os.path.join(HERE, "out", "photos" if a.make == 1024 else f"photos-{a.make}"),
                                  a.make)
    print(machine_summary())
    print(f"Thread scaling: RN50 train chain ({a.variant}), batch 64, native engine, {root}; {a.epochs} epochs "
          f"after a warm-up epoch, per process; {a.repeat} interleaved rounds, median. Cores available: {cores}.")
    rates: dict = {n: [] for n in counts}
    for r in range(a.repeat):
        for n in counts:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root, str(n), str(a.epochs),
                                  a.variant], capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            rates[n].append(res["rate"])
            print(f"  round {r + 1}: {n:>3} threads {res['rate']:8.0f} img/s", flush=True)
    base = statistics.median(rates[counts[0]]) / counts[0]
    print(f"{'threads':>8} {'img/s':>9} {'efficiency':>11}")
    for n in counts:
        med = statistics.median(rates[n])
        print(f"{n:>8} {med:9.0f} {med / (n * base):11.2f}")
    print(f"efficiency = rate(n) / (n x rate({counts[0]}) / {counts[0]}); load average at the end: "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
