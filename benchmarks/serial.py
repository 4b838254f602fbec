"""The serial part of a batch: Python CPU on one core per batch, against the kernels' work.

Per batch the Python driver (plan the batch, lease its slot, queue the kernel pass, wait,
gather labels, record), the consumer's hand-over (``next()``: the queue, the run state, the
batch cap's bookkeeping) and the recorder run on one core at a time, while the kernel team's
work (read, decode, crop, resize, normalise) spreads over every core. This script measures
both for the ResNet-50 training chain (``benchmarks/loader.py``'s ``rn50_chain``, on its
generated photo-like JPEGs, about 500x375) at batch 64 and 256, float32 CHW and uint8 HWC, and
derives the Amdahl bound on scaling efficiency at 16, 32 and 64 cores:

    E(n) = (s + p) / (n * s + p)

with ``s`` the serial work and ``p`` the parallel work of one batch: the efficiency if the
serial part overlapped nothing. (The engine does overlap it, the driver running beside the
kernel team, so the bound is pessimistic; the overlapped bound is ``min(1, (s + p) / (n * s))``,
printed beside it.)

How: each setting runs twice in its own process, on ``--small`` and on ``--large`` batches per
epoch (the same images, visited through a fixed sampler), for the same number of epochs; the
difference between the two runs is the work of the extra batches alone: start-up, imports,
plan compilation and every per-epoch cost cancel. Serial = the threads that run Python (the
main thread, the consumer, and each epoch's driver thread); parallel = every other thread (the
kernel team, the read-ahead's IO threads).

Two measures (``--mode``):

``callgrind`` (default; needs valgrind): instructions per thread (``--separate-threads=yes``),
a thread counted as Python when it ran ``_PyEval_EvalFrameDefault``. Instruction counts do not
move with the machine's load, so they compare across runs and commits on a shared machine.
callgrind runs the program some 50 times slower, and the loader's timed waits (the consumer's
queue wakes every 0.5 s while it waits, about 30,000 instructions a wake-up) would then count
50 times as often per batch as in a real run: the children stretch every
``threading.Condition.wait`` timeout by ``TIME_SCALE`` (50), so the count is per-batch work, not
callgrind's slowness. (Without it, batch 256 measured about 1 M instructions more.)

``cpu``: CPU time (time-based, moves with the machine's load and caches): the consumer's
``time.thread_time``, each driver thread's (``base._drive`` wrapped), and the process's CPU
minus both for the parallel part. ``--repeat`` runs, median.

Both set ``OMP_WAIT_POLICY=passive`` so no OpenMP thread spins (spinning would count as
parallel work). Kernel threads: ``--threads`` (default 2).

Usage::

    python benchmarks/serial.py                          # callgrind, batch 64 and 256, float and uint8
    python benchmarks/serial.py --mode cpu --repeat 5    # CPU time instead (time-based)
    python benchmarks/serial.py --batches 256 --variants float --mode both
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CORES = (16, 32, 64)
#: How much slower a run is under callgrind, about: its children's timed waits are this much longer.
TIME_SCALE = 50


def amdahl(serial: float, parallel: float, n: int) -> float:
    """Efficiency at ``n`` cores when ``serial`` of each batch's work runs on one core and
    overlaps nothing, and ``parallel`` spreads over all ``n`` (Amdahl)."""
    return (serial + parallel) / (n * serial + parallel)


def overlapped(serial: float, parallel: float, n: int) -> float:
    """Efficiency at ``n`` cores when the serial part runs beside the parallel part (the driver
    thread beside the kernel team): one batch per ``max(serial, (serial + parallel) / n)``."""
    return min(1.0, (serial + parallel) / (n * serial)) if serial > 0 else 1.0


def child(root: str, batch: int, variant: str, batches: int, epochs: int, threads: int, profile: bool = False) -> None:
    """One loader run: ``epochs`` epochs of ``batches`` batches; prints the CPU split (JSON)."""
    from loader import rn50_chain

    import loaderlib as ll
    from loaderlib._engines import base as engine_base

    scale = float(os.environ.get("LL_SERIAL_TIME_SCALE", "1"))
    if scale != 1:   # callgrind: timed waits stretched as callgrind stretches the run (see main's doc)
        import threading

        cond_wait = threading.Condition.wait

        def scaled_wait(self, timeout=None):
            return cond_wait(self, None if timeout is None else timeout * scale)

        threading.Condition.wait = scaled_wait
    ds = ll.ImageFolderDataset(root)
    n = batch * batches
    order = [i % len(ds) for i in range(n)]
    drive = engine_base._drive
    driver_cpu = [0.0]

    def timed_drive(run, queue):   # each epoch's driver thread: its whole CPU
        t0 = time.thread_time()
        try:
            drive(run, queue)
        finally:
            driver_cpu[0] += time.thread_time() - t0

    engine_base._drive = timed_drive
    loader = ll.DataLoader(ds.transform_first(rn50_chain(variant)), batch_size=batch, sampler=order,
                           num_threads=threads, profile=profile)
    p0, c0 = time.process_time(), time.thread_time()
    got = 0
    for _ in range(epochs):
        for x, _y in loader:
            got += len(x)
    consumer = time.thread_time() - c0
    process = time.process_time() - p0
    loader.close()
    assert got == n * epochs, (got, n, epochs)
    print(json.dumps({"consumer_s": consumer, "driver_s": driver_cpu[0], "process_s": process,
                      "batches": batches * epochs, "images": got}))


def _callgrind_split(files: list[str]) -> tuple[int, int]:
    """(instructions of threads that ran Python, of the others) over callgrind's per-thread files."""
    serial = parallel = 0
    for f in files:
        total, python = 0, False
        with open(f, errors="replace") as fh:
            for line in fh:
                if line.startswith("totals:"):
                    total = int(line.split()[1])
                elif not python and "_PyEval_EvalFrameDefault" in line:
                    python = True
        if python:
            serial += total
        else:
            parallel += total
    return serial, parallel


def run_one(mode: str, root: str, batch: int, variant: str, batches: int, epochs: int, threads: int,
            profile: bool = False, keep: str | None = None) -> dict:
    """One child run; returns its serial and parallel work (instructions or CPU seconds)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    if mode == "callgrind":
        env["LL_SERIAL_TIME_SCALE"] = str(TIME_SCALE)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", root, str(batch), variant, str(batches),
           str(epochs), str(threads), "1" if profile else "0"]
    if mode == "cpu":
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=HERE).stdout
        res = json.loads(out.strip().splitlines()[-1])
        serial = res["consumer_s"] + res["driver_s"]
        return {"serial": serial, "parallel": res["process_s"] - serial, "images": res["images"],
                "batches": res["batches"]}
    tmp = tempfile.mkdtemp(prefix="ll-serial-", dir=keep)
    try:
        vg = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no",
              f"--callgrind-out-file={tmp}/cg.%p"]
        proc = subprocess.run(vg + cmd, capture_output=True, text=True, env=env, cwd=HERE)
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        files = sorted(glob.glob(os.path.join(tmp, "cg.*-*")))
        serial, parallel = _callgrind_split(files)
        return {"serial": serial, "parallel": parallel, "images": res["images"], "batches": res["batches"],
                "threads_seen": len(files)}
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def measure(mode: str, root: str, batch: int, variant: str, small: int, large: int, epochs: int, threads: int,
            repeat: int, profile: bool = False, keep: str | None = None) -> dict:
    """Serial work per batch and parallel work per image from the difference of two runs."""
    per_batch, per_image = [], []
    for _ in range(repeat):
        a = run_one(mode, root, batch, variant, small, epochs, threads, profile, keep)
        b = run_one(mode, root, batch, variant, large, epochs, threads, profile, keep)
        per_batch.append((b["serial"] - a["serial"]) / (b["batches"] - a["batches"]))
        per_image.append((b["parallel"] - a["parallel"]) / (b["images"] - a["images"]))
    s, q = statistics.median(per_batch), statistics.median(per_image)
    p = q * batch
    return {"mode": mode, "batch": batch, "variant": variant, "profile": profile, "serial_per_batch": s, "parallel_per_image": q,
            "serial_share": s / (s + p), "rounds": per_batch,
            "amdahl": {n: amdahl(s, p, n) for n in CORES}, "overlapped": {n: overlapped(s, p, n) for n in CORES}}


def _fmt(mode: str, v: float) -> str:
    return f"{v / 1e6:9.3f} M instr" if mode == "callgrind" else f"{v * 1e3:9.3f} CPU-ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="callgrind", choices=("callgrind", "cpu", "both"))
    p.add_argument("--batches", default="64,256", help="batch sizes")
    p.add_argument("--variants", default="float,uint8")
    p.add_argument("--threads", type=int, default=2, help="kernel threads")
    p.add_argument("--small", type=int, default=1, help="batches per epoch of the shorter run")
    p.add_argument("--large", type=int, default=3, help="batches per epoch of the longer run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1, help="runs per setting (median); cpu mode: use 3 or more")
    p.add_argument("--profile", action="store_true", help="with the stage recorder on (DataLoader(profile=True))")
    p.add_argument("--data", help="an ImageFolder (default: benchmarks/loader.py's generated photos)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--keep", help="callgrind: keep each run's per-thread files in a folder under this one "
                                  "(for callgrind_annotate)")
    p.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        root, batch, variant, batches, epochs, threads, profile = a.child
        child(root, int(batch), variant, int(batches), int(epochs), int(threads), profile == "1")
        return
    from loader import make_dataset

    modes = ["callgrind", "cpu"] if a.mode == "both" else [a.mode]
    if "callgrind" in modes and shutil.which("valgrind") is None:
        print("benchmarks/serial.py: valgrind not found: callgrind mode skipped (use --mode cpu)")
        modes = [m for m in modes if m != "callgrind"]
    root = a.data or make_dataset(os.path.join(HERE, "out", "photos"), 1024)
    print(f"Serial part per batch: RN50 train chain, native engine, {a.threads} kernel threads, {root}; each "
          f"setting = a run of {a.large} minus a run of {a.small} batches per epoch, {a.epochs} epochs each, "
          f"{a.repeat} round(s), median; OMP_WAIT_POLICY=passive; recorder {'on' if a.profile else 'off (the default)'}. Serial = threads running Python (consumer, "
          f"drivers); parallel = the others (kernel team, IO threads). Load average {os.getloadavg()[0]:.2f}.")
    results = []
    for mode in modes:
        for variant in a.variants.split(","):
            for batch in (int(b) for b in a.batches.split(",")):
                r = measure(mode, root, batch, variant, a.small, a.large, a.epochs, a.threads, a.repeat, a.profile,
                            a.keep)
                results.append(r)
                print(f"{mode:>9} {variant:>5} batch {batch:>4}: serial {_fmt(mode, r['serial_per_batch'])} per "
                      f"batch, parallel {_fmt(mode, r['parallel_per_image'])} per image "
                      f"(serial share {100 * r['serial_share']:.3f}%); Amdahl efficiency "
                      + ", ".join(f"{n} cores {r['amdahl'][n]:.3f}" for n in CORES)
                      + "; overlapped " + ", ".join(f"{r['overlapped'][n]:.2f}" for n in CORES), flush=True)
    print(f"Amdahl: E(n) = (s + p) / (n s + p), s serial per batch, p = batch x parallel per image; load average "
          f"at the end {os.getloadavg()[0]:.2f}" + (" (cpu figures are time-based)" if "cpu" in modes else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
