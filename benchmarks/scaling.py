"""Thread scaling of the native engine on the ResNet-50 training pipeline.

Measures images/s of ``DataLoader(ImageFolderDataset(...).transform_first(RandomResizedCrop(224),
flip, Normalize, ToCHW), batch_size=64, num_threads=n)`` consumed by an infinitely fast model,
for each ``n`` in ``--threads``, and the scaling efficiency ``rate(n) / (n * rate(1))``. By default
a run may use every core, so at one kernel thread the Python driver and consumer run on a spare
core for free; ``--pin`` restricts each run to n cores, which measures scaling with cores (what
a user adding cores gets). Each
setting runs in its own process (a fresh OpenMP pool), warms up one whole epoch (the arena's
slots are touched once), then measures ``--epochs`` epochs; the settings alternate in
``--repeat`` rounds and each figure is the median of its rounds, so a disturbance on a shared
machine hits every setting alike. On a machine with more cores than images per batch / 4 the
dataset is too small to keep the threads busy: use ``--make`` to generate more. Each run also
reports how much of the time its kernel threads waited with nothing to run (``idle %``: the
team's own count of its waits, summed over the threads, over wall time x threads): in a
loader-bound run that is what the batch cap and the hand-over between batches cost, and unlike
images/s it hardly moves with other work on the machine (NOTE [ Staged items ] in
pyx/include/ll_pool.h).

``--model 16,32,64`` adds what this machine can say about cores it does not have: the
per-image CPU time of every image of the epoch (the kernel's own per-item timings, one
thread, two epochs of random crops) and the Python CPU per batch (the driver thread's and the
consumer's, ``time.thread_time``) feed a simulation of the schedule at n threads (see
``simulate``): the engine's queue across batches (NOTE [ One queue across batches ] in
pyx/include/ll_pool.h), and beside it the one-pass-per-batch schedule it replaced. It is a
model, stated as such: it knows nothing of memory bandwidth or of cores that slow each other.

Usage::

    python benchmarks/scaling.py                       # 1 and 2 threads (or 1..cores)
    python benchmarks/scaling.py --threads 1,2,4,8,16 --make 4096 --repeat 3
    python benchmarks/scaling.py --model 16,32,64      # plus the schedule model
    python benchmarks/scaling.py --item-times          # plus how much busy cores slow an image
    python benchmarks/scaling.py --pin --prefetch default,2   # the batch cap against a fixed queue of 2
    python benchmarks/scaling.py --pin --cpus 0,2,4,6,1,3,5,7 --json out.json   # n threads on the first n CPUs listed

``--cpus`` orders the CPUs the pinned runs take (default: the process's affinity, lowest first);
``benchmarks/device_check.py`` passes one hardware thread per physical core first, then whole
cores (benchmarks/_topology.py).
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


def child(root: str, threads: int, epochs: int, variant: str, pin: str = "", prefetch: str = "default") -> None:
    import time

    if pin:   # n threads on the n CPUs given: the driver and the consumer share them too
        os.sched_setaffinity(0, [int(c) for c in pin.split(",")])
    from loader import rn50_chain

    import loaderlib as ll

    ds = ll.ImageFolderDataset(root).transform_first(rn50_chain(variant))
    kw = {} if prefetch == "default" else {"prefetch": int(prefetch)}
    loader = ll.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_threads=threads, last_batch="discard", **kw)
    for _ in loader:   # warm-up epoch
        pass
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, n = time.perf_counter(), 0
    team, idle0 = None, 0
    for _ in range(epochs):
        for x, _y in loader:
            if team is None:   # the kernel team, shared by every epoch (NOTE [ One team across epochs ])
                team = _kernel_team(loader)
                idle0 = team.idle_ns if team is not None else 0
            n += len(x)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_ms = 1e3 * (cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime) / max(1, n)
    idle = (team.idle_ns - idle0) / 1e9 / (wall * team.size) if team is not None else float("nan")
    print(json.dumps({"rate": n / wall, "engine": loader.engine, "slots": loader._arena_ring.peak_leased,
                      "idle": idle, "cpu_ms": cpu_ms}))


def _kernel_team(loader):
    """The native run's kernel team (``_chain.Team``), or None for another engine."""
    try:
        return loader._current()._run.producer.plan._team
    except AttributeError:
        return None


def item_ns(plan, paths: list, threads: int, epochs: int) -> list:
    """Per-image nanoseconds inside the kernel (read + decode + transform, its own timings) for
    each of ``epochs`` passes over ``paths`` in batches of 64, two batches queued as the
    native engine keeps them (NOTE [ One queue across batches ]): one array per epoch."""
    import numpy as np

    outs = [np.empty((64, *plan.sample_shape), plan.dtype) for _ in range(2)]
    per: list = [[] for _ in range(epochs)]
    pending: list = []
    k = 0
    for epoch in range(epochs):
        for b in range(0, len(paths) - 63, 64):
            t = np.zeros((64, 3), np.int64)
            pending.append((plan.run_files_into(paths[b:b + 64], outs[k % 2], np.arange(b, b + 64), seed=0,
                                                epoch=epoch, num_threads=threads, timings=t, wait=False), t, epoch))
            k += 1
            while len(pending) > 1:   # the oldest done before its buffer is used again
                p, tt, e = pending.pop(0)
                p.result()
                per[e].append(tt.sum(axis=1))
    for p, tt, e in pending:
        p.result()
        per[e].append(tt.sum(axis=1))
    return [np.concatenate(e) for e in per]


def model_child(root: str, variant: str) -> None:
    """Per-image CPU nanoseconds (2 epochs, one thread) and the Python CPU per batch (the
    driver thread's and the consumer's, measured with ``time.thread_time``)."""
    import time

    from loader import rn50_chain

    import loaderlib as ll
    from loaderlib._chain import compile_chain
    from loaderlib._engines import base as engine_base

    chain = rn50_chain(variant)
    ds = ll.ImageFolderDataset(root)
    plan = compile_chain(chain)
    items = [int(x) for epoch in item_ns(plan, list(ds.paths), 1, 2) for x in epoch]
    plan.close()
    driver = {"cpu": 0.0}
    step = engine_base._Run.step

    def timed_step(run):   # the driver thread's CPU: its Python work (waiting costs none)
        t0 = time.thread_time()
        try:
            return step(run)
        finally:
            driver["cpu"] += time.thread_time() - t0

    engine_base._Run.step = timed_step
    loader = ll.DataLoader(ds.transform_first(chain), batch_size=64, seed=0, num_threads=1, last_batch="discard")
    for _ in loader:
        pass
    driver["cpu"], n = 0.0, 0
    c0 = time.thread_time()
    for _ in range(2):
        for _x, _y in loader:
            n += 1
    consumer = time.thread_time() - c0
    engine_base._Run.step = step
    print(json.dumps({"items": items, "serial_ns": (driver["cpu"] + consumer) / n * 1e9}))


def items_child(root: str, variant: str, counts: str, rounds: int) -> None:
    """Mean wall time of one image inside the kernel (its read, decode and transform, from the
    kernel's own timings) with n threads busy, for each n: how much cores slow each other."""
    from loader import rn50_chain

    import loaderlib as ll
    from loaderlib._chain import compile_chain

    paths = list(ll.ImageFolderDataset(root).paths)
    plan = compile_chain(rn50_chain(variant))
    res: dict = {}
    for _ in range(rounds):
        for n in [int(t) for t in counts.split(",")]:
            measured = item_ns(plan, paths, n, 2)[1]   # the first epoch is a warm-up
            res.setdefault(n, []).append(float(measured.mean()) * 1e-6)
    print(json.dumps(res))


def simulate(items: list, serial: float, threads: int, batch: int = 64, queue: bool = True) -> float:
    """Seconds per epoch of ``items`` (ns) on ``threads`` cores.

    ``queue=False``: the old schedule, one kernel pass per batch: the batch's images go in
    order to whichever thread is free first, the batch ends with its last image, then the
    serial Python part runs while the kernel threads wait.
    ``queue=True``: NOTE [ One queue across batches ]: the images of the whole epoch go in
    order to whichever thread is free first, with no barrier; the Python part runs beside
    them and takes ``serial`` of CPU per batch from the same cores (a pseudo-item per batch),
    and the epoch cannot be shorter than the driver's serial time.
    """
    import heapq

    if not queue:
        total = 0.0
        for b in range(0, len(items) - batch + 1, batch):
            free = [0.0] * threads
            for cost in items[b:b + batch]:
                heapq.heappush(free, heapq.heappop(free) + cost)
            total += max(free) + serial
        return total * 1e-9
    free = [0.0] * threads
    nb = len(items) // batch
    for b in range(nb):
        for cost in [*items[b * batch:(b + 1) * batch], serial]:
            heapq.heappush(free, heapq.heappop(free) + cost)
    return max(max(free), nb * serial) * 1e-9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--make", type=int, default=1024, help="images to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1..cores, doubling)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variant", default="float", choices=("float", "uint8"))
    p.add_argument("--model", default=None, help="comma-separated thread counts to predict with the schedule model")
    p.add_argument("--item-times", action="store_true",
                   help="also the mean time of one image inside the kernel with n threads busy (its own timings)")
    p.add_argument("--items-child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--pin", action="store_true",
                   help="run n threads on n cores (the process's affinity), so the Python driver and consumer "
                        "share the cores at every n: scaling with cores rather than with kernel threads")
    p.add_argument("--prefetch", default="default",
                   help="comma-separated prefetch settings to compare, interleaved: 'default' (the native engine's "
                        "batch cap, NOTE [ Batches in memory ]) and/or fixed queue depths (e.g. default,2)")
    p.add_argument("--cpus", default=None,
                   help="with --pin: the CPUs in the order the runs take them (n threads run on the first n)")
    p.add_argument("--json", default=None, help="also write the rates per setting and round here")
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    p.add_argument("--model-child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.model_child:
        model_child(*a.model_child)
        return
    if a.items_child:
        root, variant, counts, rounds = a.items_child
        items_child(root, variant, counts, int(rounds))
        return
    if a.child:
        root, threads, epochs, variant, pin, prefetch = a.child
        child(root, int(threads), int(epochs), variant, "" if pin == "-" else pin, prefetch)
        return

    from _report import machine_summary

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
    print(machine_summary())
    root = photos_for(a, a.make, os.path.join(HERE, "out"))
    print(f"Thread scaling: RN50 train chain ({a.variant}), batch 64, native engine, {root}; {a.epochs} epochs "
          f"after a warm-up epoch, per process; {a.repeat} interleaved rounds, median. Cores available: {cores}"
          + ("; each run pinned to as many cores as threads (--pin)." if a.pin else
             "; every run may use them all (at n threads the Python driver and consumer use the spare cores)."))
    order = [int(c) for c in a.cpus.split(",")] if a.cpus else sorted(os.sched_getaffinity(0))
    if a.pin and max(counts) > len(order):
        p.error(f"--pin: {max(counts)} threads need {max(counts)} CPUs, {len(order)} given")
    if a.pin and a.cpus:
        print(f"CPUs taken in this order: {','.join(map(str, order))}")
    settings = a.prefetch.split(",")
    rates: dict = {(n, pf): [] for n in counts for pf in settings}
    slots: dict = {(n, pf): 0 for n in counts for pf in settings}
    idle: dict = {(n, pf): [] for n in counts for pf in settings}
    for r in range(a.repeat):
        for n in counts:
            for pf in settings:
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root, str(n),
                                      str(a.epochs), a.variant,
                                      ",".join(map(str, order[:n])) if a.pin else "-", pf],
                                     capture_output=True, text=True, check=True).stdout
                res = json.loads(out.strip().splitlines()[-1])
                rates[n, pf].append(res["rate"])
                slots[n, pf] = max(slots[n, pf], res["slots"])
                idle[n, pf].append(res.get("idle", float("nan")))
                print(f"  round {r + 1}: {n:>3} threads, prefetch {pf:>7}: {res['rate']:8.0f} img/s, "
                      f"{res['slots']} batch slots at most, kernel threads idle {100 * res.get('idle', 0):.1f}% "
                      f"of the time, {res.get('cpu_ms', 0):.3f} CPU ms/img", flush=True)
    for pf in settings:
        if len(settings) > 1:
            print(f"prefetch={pf}" + (" (the batch cap, NOTE [ Batches in memory ])" if pf == "default" else
                                      " (a fixed queue)"))
        base = statistics.median(rates[counts[0], pf]) / counts[0]
        print(f"{'threads':>8} {'img/s':>9} {'efficiency':>11} {'slots':>6} {'idle %':>7}")
        for n in counts:
            med = statistics.median(rates[n, pf])
            print(f"{n:>8} {med:9.0f} {med / (n * base):11.2f} {slots[n, pf]:>6} "
                  f"{100 * statistics.median(idle[n, pf]):7.1f}")
    if len(settings) > 1:
        ref = settings[0]
        for pf in settings[1:]:
            print(f"prefetch={ref} / prefetch={pf}: " + ", ".join(
                f"{n} threads {statistics.median(rates[n, ref]) / statistics.median(rates[n, pf]):.3f}x"
                for n in counts))
    print(f"efficiency = rate(n) / (n x rate({counts[0]}) / {counts[0]}); load average at the end: "
          f"{os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"variant": a.variant, "pin": a.pin, "cpus": order if a.pin else None, "epochs": a.epochs,
                       "repeat": a.repeat, "root": root,
                       "rates": {pf: {str(n): rates[n, pf] for n in counts} for pf in settings},
                       "median": {pf: {str(n): statistics.median(rates[n, pf]) for n in counts} for pf in settings},
                       "slots": {pf: {str(n): slots[n, pf] for n in counts} for pf in settings},
                       "idle": {pf: {str(n): idle[n, pf] for n in counts} for pf in settings}}, f, indent=1)
    if a.item_times:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--items-child", root, a.variant,
                              ",".join(map(str, counts)), str(a.repeat)], capture_output=True, text=True,
                             check=True).stdout
        per = {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}
        one = statistics.median(per[counts[0]])
        print("Time of one image inside the kernel (read + decode + transform, its own timings, second of two "
              f"epochs, {a.repeat} rounds, median) with n threads busy:")
        for n in counts:
            med = statistics.median(per[n])
            print(f"{n:>8} threads {med:.3f} ms per image  ({med / one:.3f}x {counts[0]} thread)")
    if a.model:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model-child", root, a.variant],
                             capture_output=True, text=True, check=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        items, serial = res["items"], res["serial_ns"]
        import numpy as np

        arr = np.asarray(items, np.float64) * 1e-6
        print(f"Schedule model: {len(items)} images, {arr.mean():.3f} CPU-ms per image (p50 {np.median(arr):.3f}, "
              f"p95 {np.percentile(arr, 95):.3f}, max {arr.max():.3f}), Python {serial * 1e-6:.3f} CPU-ms per batch "
              f"(driver + consumer), measured at one thread here; predicted for the engine's queue and for the "
              f"old one-pass-per-batch schedule.")
        one = simulate(items, serial, 1)
        print(f"{'threads':>8} {'queue img/s':>12} {'efficiency':>11} {'per-batch img/s':>16} {'efficiency':>11}")
        for n in [int(t) for t in a.model.split(",")]:
            sec, old = simulate(items, serial, n), simulate(items, serial, n, queue=False)
            done = len(items) // 64 * 64
            print(f"{n:>8} {done / sec:12.0f} {one / (n * sec):11.2f} {done / old:16.0f} {one / (n * old):11.2f}")

if __name__ == "__main__":
    main()
