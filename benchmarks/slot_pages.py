"""Batch slots in small pages or in transparent huge pages (NOTE [ Slots in small pages ] in
pyx/_arena.pyx): what each costs where a slot is first written, and in the steady state.

Each round runs two fresh processes, one per setting (the default, MADV_NOHUGEPAGE, and
``LOADERLIB_HUGE_PAGES=1``), in alternating order. Each process runs the ResNet-50 float
chain of benchmarks/loader.py (RandomResizedCrop(224) + flip + Normalize + CHW float32,
batch 64, 2 threads) on the ImageNet-like photos and measures:

- **window**: the images/s, CPU-ms and system CPU-ms per image of the 2,048 images after the
  first batch, benchmarks/loader.py's measured window, where the second batch slot is
  written for the first time;
- **steady**: the CPU-ms per image of epochs 3 to ``--epochs``, when every slot has been
  written before;
- the process's page faults in the window and its AnonHugePages at the end.

Medians over the rounds, and the per-round values. Usage::

    python benchmarks/slot_pages.py [--rounds 6] [--epochs 6] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _photos import add_data_kind, photos_for

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOW = 2048


def child(root: str, epochs: int) -> None:
    import resource
    import time

    from loader import rn50_chain

    import loaderlib as ll

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt

    ds = ll.ImageFolderDataset(root).transform_first(rn50_chain("float"))
    loader = ll.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_threads=2, last_batch="discard")
    it = iter(loader)
    next(it)
    (c0, s0, f0), t0, n = usage(), time.perf_counter(), 0
    while n < WINDOW:
        for x, _ in it:
            n += len(x)
            if n >= WINDOW:
                break
        else:
            it = iter(loader)
    (c1, s1, f1), dt = usage(), time.perf_counter() - t0
    for _ in it:   # the rest of that epoch
        pass
    steady = []
    for ep in range(max(0, epochs - 2)):
        c, m = usage()[0], 0
        for x, _ in loader:
            m += len(x)
        steady.append(1000 * (usage()[0] - c) / m)
    huge = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                huge = int(line.split()[1]) // 1024
    print(json.dumps({"rate": n / dt, "cpu_ms": 1000 * (c1 - c0) / n, "sys_ms": 1000 * (s1 - s0) / n,
                      "faults": f1 - f0, "steady_ms": statistics.median(steady) if steady else float("nan"),
                      "huge_mb": huge}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024)
    add_data_kind(p)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--epochs", type=int, default=6, help="epochs per process (the steady state is epochs 3+)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]))
        return
    from _report import machine_summary

    print(machine_summary())
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    try:
        thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
        defrag = open("/sys/kernel/mm/transparent_hugepage/defrag").read().strip()
    except OSError:
        thp = defrag = "unknown"
    print(f"transparent huge pages: enabled {thp}; defrag {defrag}")
    print(f"RN50 float chain, batch 64, 2 threads; window: {WINDOW} images after the first batch; "
          f"steady: epochs 3-{a.epochs}; {a.rounds} rounds, fresh processes, order alternating")
    settings = {"small pages (default)": "0", "LOADERLIB_HUGE_PAGES=1": "1"}
    runs: dict = {k: [] for k in settings}
    for r in range(a.rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            env = dict(os.environ, LOADERLIB_HUGE_PAGES=settings[name])
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root, str(a.epochs)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"\n{'slots in':<24} {'window img/s':>12} {'CPU-ms/img':>11} {'sys-ms/img':>11} {'faults':>7} "
          f"{'steady CPU-ms/img':>18} {'huge MB':>8}")
    med = {}
    for name, rs in runs.items():
        m = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        med[name] = m
        print(f"{name:<24} {m['rate']:12.0f} {m['cpu_ms']:11.3f} {m['sys_ms']:11.3f} {m['faults']:7.0f} "
              f"{m['steady_ms']:18.3f} {m['huge_mb']:8.0f}")
    print("(medians; per round, window img/s: " + "; ".join(
        f"{name}: " + ", ".join(f"{x['rate']:.0f}" for x in rs) for name, rs in runs.items()) + ")")
    a_, b_ = med["small pages (default)"], med["LOADERLIB_HUGE_PAGES=1"]
    print(f"small / huge: window throughput {a_['rate'] / b_['rate']:.3f}x, "
          f"steady CPU per image {a_['steady_ms'] / b_['steady_ms']:.3f}x")


if __name__ == "__main__":
    main()
