"""Storage benchmark: the ResNet-50 uint8 training chain (RandomResizedCrop(224) + flip, batch
64) on photos behind slow storage, consumed by an infinitely fast model.

Storage, one row each:

* ``warm local``: the files in the page cache;
* ``latencyfs L ms``: the same files through latencyfs (``benchmarks/latencyfs.c``, a
  multi-threaded C FUSE passthrough): every file costs L ms +-50% (half at open, half at the
  first read), and ``direct_io`` bypasses the page cache, so every epoch pays it;
* ``cold local disk``: local files evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before
  each epoch (``/proc/sys/vm/drop_caches`` may not be writable; this needs only file access).

Loaders, one column each, each run in a fresh process:

* ``loaderlib default``: ``DataLoader(ds, batch_size=64, shuffle=True)``;
* ``loaderlib AUTOTUNE``: ``num_threads=ll.AUTOTUNE``;
* ``loaderlib io_depth``: the best of ``--io-depths`` when the installed loaderlib takes
  ``io_depth`` (it says so when it does not);
* ``PyTorch``: its DataLoader at its best worker count of ``--torch-workers``, OpenCV decode and
  the same transforms (``benchmarks/loader.py``'s peer);
* ``tf.data``: file names -> ``interleave(read_file, num_parallel_calls=AUTOTUNE)`` ->
  ``map(decode_and_crop_jpeg ..., AUTOTUNE)`` -> ``batch`` -> ``prefetch(AUTOTUNE)``, in the
  peers' virtualenv (``--peers``, default ``.venv-peers/bin/python`` from ``make bench-peers``);
* ``ideal`` = min(CPU ceiling, IO ceiling), both measured in the same round: the CPU ceiling is
  the best loaderlib column on warm local files; the IO ceiling is raw whole-file reads of the
  same files from the same storage by 256 native threads (``benchmarks/io_mechanism.c``).

With ``--remote``, the rows are remote instead: the same photos over HTTP (nginx) and S3
(moto's server) at ``--rtts`` ms round trip (``tc netem`` in a network namespace, or a delaying
proxy where that is unavailable), as record shards, WebDataset shards and one object per image,
with and without the shard cache, against PyTorch's DataLoader reading the same URLs through
obstore (``benchmarks/_remote_bench.py`` says how each cell and ceiling is measured).

With ``--storage-cpus CPUS`` (``1`` on two cores, ``12-15`` on sixteen; ``auto``: the last
quarter of the usable CPUs, at least one) the storage side
(the latencyfs daemons, nginx, moto and the delay proxy) runs on those CPUs and every loader
and ceiling on the others: storage that lives on other hardware, as a filer or an object store
does, instead of a simulation taking the loader's cores. The CPU ceiling is then measured on
the loader's CPUs too, so the ratios compare like with like. The output says which CPUs ran what.

A measurement runs ``1 + --epochs`` epochs and reports images/s over the last ``--epochs``: the
first is warm-up (process and worker start, first touch). Each epoch is timed from ``iter()``
to its last batch. Rounds are interleaved (every cell once per round) and medians reported.

Usage::

    python benchmarks/storage.py                     # 1,024 photos; 0, 1, 4, 16 ms; 3 rounds
    python benchmarks/storage.py --quick             # 512 photos; 0 and 4 ms; one round
    python benchmarks/storage.py --latencies 4,16 --repeat 5 --images 2048
    python benchmarks/storage.py --remote            # HTTP and S3 at 5 and 20 ms round trip; 3 rounds
    python benchmarks/storage.py --remote --quick    # 256 photos, HTTP at 5 ms, PyTorch with 16 workers
    python benchmarks/storage.py --storage-cpus auto # storage on CPUs of its own (make bench-storage-split)
    python benchmarks/storage.py --probe             # ll.probe_storage's prediction against the measured
                                                     # default at 1, 4, 16, 64 ms, HTTP and S3 at 5 ms
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from _epochs import evict, timed_epochs
from _photos import add_data_kind, photos_for
from loader import BATCH, _torch_dataset, image_files, rn50_chain, tf_train_image

HERE = os.path.dirname(os.path.abspath(__file__))

IO_CEILING_THREADS = 256

#: CPUs the loaders and ceilings run on (``--storage-cpus`` leaves the rest to storage); None: all.
LOADER_CPUS: list[int] | None = None


def parse_cpus(spec: str) -> list[int]:
    """``"1"``, ``"8-15"``, ``"0,2-3"`` -> sorted CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def on_loader_cpus(cmd: list[str]) -> list[str]:
    """``cmd`` run on the loader's CPUs (``taskset``) when storage has CPUs of its own."""
    if LOADER_CPUS is None:
        return cmd
    return ["taskset", "-c", ",".join(map(str, LOADER_CPUS)), *cmd]


def split_cpus(spec: str) -> str:
    """Pin this process (and so the storage servers it starts) to ``spec``'s CPUs, and the
    loaders to the rest; returns a line saying so."""
    global LOADER_CPUS
    usable = sorted(os.sched_getaffinity(0))
    storage = usable[-max(1, len(usable) // 4):] if spec == "auto" else parse_cpus(spec)
    if not storage or not set(storage) <= set(usable):
        raise SystemExit(f"--storage-cpus {spec}: CPUs {storage} are not all usable here (usable: {usable})")
    LOADER_CPUS = [c for c in usable if c not in storage]
    if not LOADER_CPUS:
        raise SystemExit(f"--storage-cpus {spec} leaves no CPU for the loaders (usable: {usable})")
    os.sched_setaffinity(0, storage)
    return (f"CPUs split: storage (latencyfs daemons, nginx, moto, the delay proxy) on {storage}; every loader, "
            f"its threads and workers, and the ceilings on {LOADER_CPUS} ({len(LOADER_CPUS)} cores)")


# --------------------------------------------------------------------------- one measurement (child)


def run_loaderlib(root: str, epochs: int, cold: list[str] | None, threads: str, io_depth: int | None) -> dict:
    import loaderlib as ll

    kw = {}
    if threads == "autotune":
        kw["num_threads"] = ll.AUTOTUNE
    elif threads != "default":
        kw["num_threads"] = int(threads)
    if io_depth is not None:
        kw["io_depth"] = io_depth
    ds = ll.ImageFolderDataset(root).transform_first(rn50_chain("uint8"))
    loader = ll.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, last_batch="discard", **kw)
    its: list = []

    def epoch():
        its.append(iter(loader))
        return its[-1]

    res = timed_epochs(epoch, epochs, cold)
    res["num_threads"] = getattr(loader, "num_threads", None)
    # The last epoch's read-ahead stage, from its own counters (profiling stays off).
    reader = getattr(getattr(getattr(its[-1], "_run", None), "producer", None), "reader", None)
    if reader is not None and hasattr(reader, "counters"):
        from loaderlib.stats import ExtractStats

        epoch_s = res["images"] / res["images_per_s"] / max(1, epochs)
        ext = ExtractStats.from_counters(reader.counters(), epoch_s)
        if not ext.inline:
            res["read"] = {"io_depth": ext.io_depth, "latency_p50_ms": ext.latency_p50_ms,
                           "waiting": ext.read_wait_s / (max(1, loader.num_threads) * epoch_s)}
    return res


def run_torch(root: str, epochs: int, cold: list[str] | None, workers: int) -> dict:
    import cv2
    import torch

    cv2.setNumThreads(1)
    loader = torch.utils.data.DataLoader(_torch_dataset(root, "uint8"), batch_size=BATCH, shuffle=True,
                                         num_workers=workers, drop_last=True, persistent_workers=True)
    return timed_epochs(lambda: loader, epochs, cold)


def run_tfdata(root: str, epochs: int, cold: list[str] | None) -> dict:
    import tensorflow as tf

    paths, labels = image_files(root)
    auto = tf.data.AUTOTUNE

    def read(path, label):
        return tf.data.Dataset.from_tensors((tf.io.read_file(path), label))

    ds = (tf.data.Dataset.from_tensor_slices((paths, labels)).shuffle(len(paths), seed=0)
          .interleave(read, cycle_length=auto, num_parallel_calls=auto, deterministic=False)
          .map(lambda data, label: (tf_train_image(data, "uint8"), label), num_parallel_calls=auto)
          .batch(BATCH, drop_remainder=True).prefetch(auto))
    res = timed_epochs(lambda: ((x.numpy(), y.numpy()) for x, y in ds), epochs, cold)
    res["version"] = tf.__version__
    return res


def child(argv: list[str]) -> None:
    if argv[0] == "probe":
        import _probe_bench

        print(json.dumps(_probe_bench.child(argv[1])))
        return
    if argv[0] == "remote":
        import _remote_bench

        print(json.dumps(_remote_bench.child(argv[1])))
        return
    kind, root, epochs, cold, arg, depth = argv
    cold_paths = image_files(root)[0] if cold == "1" else None
    io_depth = None if depth == "-" else int(depth)
    if kind == "loaderlib":
        res = run_loaderlib(root, int(epochs), cold_paths, arg, io_depth)
    elif kind == "torch":
        res = run_torch(root, int(epochs), cold_paths, int(arg))
    else:
        res = run_tfdata(root, int(epochs), cold_paths)
    print(json.dumps(res))


# --------------------------------------------------------------------------- parent


def measure(kind: str, root: str, epochs: int, cold: bool, arg: str = "-", io_depth: int | None = None,
            python: str | None = None, timeout: float = 1800) -> dict:
    cmd = on_loader_cpus([python or sys.executable, os.path.abspath(__file__), "--child", kind, root, str(epochs),
                          "1" if cold else "0", arg, "-" if io_depth is None else str(io_depth)])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} {arg} on {root} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_remote(spec: dict, timeout: float = 1800) -> dict:
    """One remote cell (``_remote_bench.child``) in a fresh process."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(spec, f)
        f.flush()
        out = subprocess.run(on_loader_cpus([sys.executable, os.path.abspath(__file__), "--child", "remote", f.name]),
                             capture_output=True, text=True, check=False, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{spec['kind']} on {spec['base']} ({spec['layout']}) failed (exit {out.returncode}):\n"
                           f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_probe(spec: dict, timeout: float = 600) -> dict:
    """One ``ll.probe_storage`` run (``_probe_bench.child``) in a fresh process on the loader's CPUs."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(spec, f)
        f.flush()
        out = subprocess.run(on_loader_cpus([sys.executable, os.path.abspath(__file__), "--child", "probe", f.name]),
                             capture_output=True, text=True, check=False, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def io_ceiling(exe: str, paths: list[str], cold: bool) -> float:
    """Whole-file reads (open, fstat, read, close) by 256 native threads: files/s. Every file
    once when cold; otherwise the list cycled to at least 2,048 reads, so that starting the
    threads is a small part of the run."""
    import tempfile

    if cold:
        evict(paths)
    files = len(paths) if cold else max(len(paths), 2048)
    with tempfile.NamedTemporaryFile("w", suffix=".list") as f:
        f.write("\n".join(paths) + "\n")
        f.flush()
        out = subprocess.run(on_loader_cpus([exe, "--mode=threads", f"--depth={IO_CEILING_THREADS}",
                                             f"--files={files}", f.name]),
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["files_per_s"]


def takes_io_depth() -> bool:
    import loaderlib as ll

    return "io_depth" in inspect.signature(ll.DataLoader).parameters


def machine() -> str:
    cpu = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}; {len(os.sched_getaffinity(0))} usable cores; {platform.system()} {platform.release()}"


def disk_of(path: str) -> str:
    """The device and filesystem that hold ``path`` (the longest mountpoint above it)."""
    path = os.path.realpath(path)
    best = ("?", "/", "?")
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fs = line.split()[:3]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                best = (dev, mnt, fs)
    return f"{best[0]} ({best[2]} on {best[1]})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder of JPEGs (default: generated photo-like JPEGs)")
    p.add_argument("--images", type=int, default=1024, help="photos to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--latencies", default="0,1,4,16", help="per-file latencies through latencyfs, ms")
    p.add_argument("--jitter", type=float, default=0.5, help="each latency is L x uniform[1 - J, 1 + J]")
    p.add_argument("--epochs", type=int, default=1, help="timed epochs per measurement, after one warm-up epoch")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--torch-workers", default="8,16,32", help="PyTorch DataLoader worker counts to try")
    p.add_argument("--io-depths", default="16,64,256", help="io_depth values to try, where loaderlib takes it")
    p.add_argument("--peers", default=os.path.join(os.path.dirname(HERE), ".venv-peers", "bin", "python"),
                   help="an interpreter with tensorflow (make bench-peers builds .venv-peers)")
    p.add_argument("--no-cold", action="store_true", help="leave out the cold local disk row")
    p.add_argument("--no-autotune", action="store_true", help="leave out the loaderlib AUTOTUNE column")
    p.add_argument("--quick", action="store_true",
                   help="a short run: 512 photos, 0 and 4 ms, PyTorch with 16 workers, io_depth 64, one round")
    p.add_argument("--storage-cpus", metavar="CPUS",
                   help="run the storage side (latencyfs, nginx, moto, the delay proxy) on these CPUs (1, 12-15; auto: "
                        "the last quarter, at least one) and the loaders on the others")
    p.add_argument("--probe", action="store_true",
                   help="validate ll.probe_storage: its predicted ceiling against the measured default loader at "
                        "--latencies (default 1,4,16,64 here) and over --protocols at --rtts (default 5 here; "
                        "benchmarks/_probe_bench.py)")
    p.add_argument("--probe-seconds", type=float, default=10.0, help="the probe's time budget (--probe)")
    remote = p.add_argument_group("remote rows (--remote)")
    remote.add_argument("--remote", action="store_true",
                        help="HTTP and S3 rows instead of the local ones (benchmarks/_remote_bench.py)")
    remote.add_argument("--rtts", default="5,20", help="round trips added to every request, ms")
    remote.add_argument("--protocols", default="http,s3", help="http (nginx) and/or s3 (moto's server)")
    remote.add_argument("--layouts", default="records,webdataset,objects",
                        help="record shards, WebDataset shards, one object per image")
    remote.add_argument("--shards", type=int, default=8, help="record and WebDataset shards")
    remote.add_argument("--net", choices=("auto", "netem", "proxy"), default="auto",
                        help="how latency is added: netem in a network namespace, else (auto) or always (proxy) "
                             "a proxy holding each request for a round trip")
    remote.add_argument("--io-conc", type=int, default=256, help="threads of the remote IO ceiling")
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child)
        return
    from _report import machine_summary

    summary = machine_summary()   # before --storage-cpus narrows this process's CPUs
    split = split_cpus(a.storage_cpus) if a.storage_cpus else None
    if a.quick and a.remote:
        a.images, a.rtts, a.protocols, a.torch_workers, a.repeat = 256, "5", "http", "16", 1
    elif a.quick:
        a.images, a.latencies, a.torch_workers, a.io_depths, a.repeat = 512, "0,4", "16", "64", 1
    if a.probe:
        import _probe_bench

        if a.latencies == "0,1,4,16":
            a.latencies = "1,4,16,64"
        if a.rtts == "5,20":
            a.rtts = "5"
        _probe_bench.main(a, measure, measure_remote, measure_probe, summary, split)
        return
    if a.remote:
        import _remote_bench

        root = photos_for(a, a.images, os.path.join(HERE, "out"))
        _remote_bench.main(a, root, measure_remote, summary, split)
        return

    import io_mechanism
    from _latencyfs import mount

    root = photos_for(a, a.images, os.path.join(HERE, "out"))
    paths = image_files(root)[0]
    n = len(paths)
    latencies = [float(x) for x in a.latencies.split(",") if x != ""]
    workers = [int(x) for x in a.torch_workers.split(",") if x]
    io_depths = [int(x) for x in a.io_depths.split(",") if x] if takes_io_depth() else []
    exe = io_mechanism.build()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    have_tf = os.path.exists(a.peers) and subprocess.run(
        [a.peers, "-c", "import tensorflow"], capture_output=True, check=False).returncode == 0

    print(summary)
    print(f"storage benchmark: {n} JPEGs ({sum(map(os.path.getsize, paths)) / n / 1024:.0f} KiB on average) "
          f"from {root}; RandomResizedCrop(224) + flip, HWC uint8, batch {BATCH}; images/s over {a.epochs} "
          f"epoch(s) after a warm-up epoch, each loader in a fresh process; median of {a.repeat} interleaved "
          f"round(s); the machine was shared with other work (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs at the start), so figures are noisy: compare ratios")
    print(split or "CPUs shared: the storage side (latencyfs daemons) runs on the loaders' cores")
    if not io_depths:
        print("io_depth not supported by this build: that column is left out")
    if not have_torch:
        print("torch is not installed: the PyTorch column is left out (make .venv/.loaderlib-test-deps)")
    if not have_tf:
        print(f"tf.data: not available ({a.peers} with tensorflow not found; make bench-peers builds it)")

    with contextlib.ExitStack() as stack:
        rows: list[tuple[str, str, bool]] = [("warm local", root, False)]
        mounts = []
        for lat in latencies:
            m = stack.enter_context(mount(root, lat, a.jitter))
            mounts.append(m)
            rows.append((f"latencyfs {lat:g} ms", m.path, False))
        if not a.no_cold:
            rows.append(("cold local disk", root, True))
            print(f"cold local disk: {disk_of(root)}, this machine's page cache dropped for the files before every "
                  "epoch (a virtual disk may still be cached by its host)")
        for m in mounts:
            print(m.describe())

        cols = ["loaderlib default"] + ([] if a.no_autotune else ["loaderlib AUTOTUNE"])
        cols += [f"io_depth={d}" for d in io_depths]
        cols += [f"torch {w}w" for w in workers] if have_torch else []
        cols += ["tf.data"] if have_tf else []
        runs: dict = {}
        reads: dict = {}   # the default's read-ahead stage, last epoch, per round
        bounds: dict = {}  # per cell and round: the wait for each timed epoch's first batch
        t_run = time.perf_counter()
        for r in range(a.repeat):
            for name, where, cold in rows:
                for c in cols:
                    if c == "loaderlib default":
                        res = measure("loaderlib", where, a.epochs, cold, "default")
                    elif c == "loaderlib AUTOTUNE":
                        res = measure("loaderlib", where, a.epochs, cold, "autotune")
                    elif c.startswith("io_depth="):
                        res = measure("loaderlib", where, a.epochs, cold, "default", int(c.split("=")[1]))
                    elif c.startswith("torch "):
                        res = measure("torch", where, a.epochs, cold, c.split()[1][:-1])
                    else:
                        res = measure("tfdata", where, a.epochs, cold, python=a.peers)
                    runs.setdefault((name, c), []).append(res["images_per_s"])
                    if c == "loaderlib default" and "read" in res:
                        reads.setdefault(name, []).append(res["read"])
                    if "boundary" in res:
                        bounds.setdefault((name, c), []).append(res["boundary"])
                    print(f"  round {r + 1}: {name} / {c}: {res['images_per_s']:,.0f} img/s", flush=True)
                where_paths = [os.path.join(where, os.path.relpath(x, root)) for x in paths]
                runs.setdefault((name, "io ceiling"), []).append(io_ceiling(exe, where_paths, cold))
            print(f"round {r + 1} of {a.repeat} done ({time.perf_counter() - t_run:.0f} s; load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            if r + 1 < a.repeat:
                print_table(runs, rows, cols, f"medians after {r + 1} round(s)")
    for m in mounts:
        print(m.report)
    print_table(runs, rows, cols, f"medians of {a.repeat} round(s)")
    print_read_ahead(runs, rows, reads)
    print_boundaries(bounds, rows, a.epochs)
    print("\nevery cell, images/s per round: " + "; ".join(
        f"{name} / {c}: " + ", ".join(f"{x:.0f}" for x in runs[name, c]) for name, _w, _c in rows
        for c in [*cols, "io ceiling"]))


def print_boundaries(bounds: dict, rows: list, epochs: int) -> None:
    """The epoch boundary (NOTE [ Batches in memory ]): the share of the timed window the consumer
    spent waiting for an epoch's first batch, and that wait against the median wait between two
    batches inside an epoch, for the loaderlib columns."""
    cells = [(name, c) for name, _w, _c in rows for (n2, c) in bounds if n2 == name and c.startswith("loaderlib")]
    if not cells:
        return
    print(f"\nepoch boundaries ({epochs} timed epochs per run, each timed from iter()): share of the window spent "
          "waiting for epochs' first batches, and beyond the median wait between two batches mid-epoch (the "
          "boundary's own cost); median wait for a first batch / median interval between batches mid-epoch "
          "(medians of rounds)")
    for name, c in cells:
        b = bounds[name, c]
        print(f"  {name} / {c}: {100 * statistics.median(x['share'] for x in b):.1f}% of the window, "
              f"{100 * statistics.median(x['excess'] for x in b):.1f}% beyond mid-epoch waits, "
              f"first batch {statistics.median(x['start_ms'] for x in b):.1f} ms vs "
              f"{statistics.median(x['gap_ms'] for x in b):.1f} ms between batches "
              f"({b[0]['starts']} epoch starts per run)")


def print_read_ahead(runs: dict, rows: list, reads: dict) -> None:
    """Where the default's time went when it read ahead, and each latencyfs row against the same
    filesystem at 0 ms: that row is the CPU ceiling of reading through FUSE on these cores (the
    daemon's work shares them), which the warm local ceiling does not pay."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    if reads:
        print("\nloaderlib default's read-ahead stage in its last epoch (median of rounds): reads in flight allowed, "
              "read latency p50, and the share of the decode threads' time spent waiting for bytes")
        for name, _w, _c in rows:
            if name in reads:
                r = reads[name]
                print(f"  {name}: io_depth {statistics.median(x['io_depth'] for x in r):.0f}, "
                      f"p50 {statistics.median(x['latency_p50_ms'] for x in r):.2f} ms, "
                      f"waiting {100 * statistics.median(x['waiting'] for x in r):.1f}%")
    if ("latencyfs 0 ms", "loaderlib default") in med:
        fs0 = max(med.get(("latencyfs 0 ms", c), 0.0) for c in ("loaderlib default", "loaderlib AUTOTUNE"))
        print(f"\nagainst the same filesystem at 0 ms per file (its CPU ceiling on these cores, {fs0:,.0f} img/s):")
        for name, _w, _c in rows:
            if name.startswith("latencyfs") and name != "latencyfs 0 ms":
                print(f"  {name}: default {med[name, 'loaderlib default'] / fs0:.2f}x, "
                      f"AUTOTUNE {med.get((name, 'loaderlib AUTOTUNE'), float('nan')) / fs0:.2f}x")


def print_table(runs: dict, rows: list, cols: list[str], title: str) -> None:
    """One row per storage; cells are median images/s; ratios are the loaderlib default's."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu_ceiling = max(med["warm local", c] for c in cols if c.startswith(("loaderlib", "io_depth")))
    has = {prefix: any(c.startswith(prefix) for c in cols) for prefix in ("io_depth=", "torch ", "tf.data")}

    def best(name: str, prefix: str) -> tuple[float, str]:
        return max((med[name, c], c) for c in cols if c.startswith(prefix))

    print(f"\n== {title}. CPU ceiling: the best loaderlib column on warm local files, {cpu_ceiling:,.0f} img/s. "
          f"IO ceiling: whole-file reads by {IO_CEILING_THREADS} native threads from the same storage. "
          "ideal = min(CPU ceiling, IO ceiling); 'x ideal' and 'x torch' are ratios of the loaderlib columns.\n")
    head = ["storage", "loaderlib default", "AUTOTUNE"]
    head += ["io_depth (best)"] if has["io_depth="] else []
    head += ["PyTorch (best)"] if has["torch "] else []
    head += ["tf.data"] if has["tf.data"] else []
    head += ["IO ceiling", "ideal", "default x ideal", "AUTOTUNE x ideal"]
    head += ["io_depth x ideal"] if has["io_depth="] else []
    head += ["default x torch"] if has["torch "] else []
    head += ["io_depth x torch"] if has["io_depth="] and has["torch "] else []
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for name, _where, _cold in rows:
        io = med[name, "io ceiling"]
        ideal = min(cpu_ceiling, io)
        d = med[name, "loaderlib default"]
        auto = med.get((name, "loaderlib AUTOTUNE"), float("nan"))
        cells = [name, f"{d:,.0f}", f"{auto:,.0f}"]
        if has["io_depth="]:
            dep, c = best(name, "io_depth=")
            cells.append(f"{dep:,.0f} ({c.split('=')[1]})")
        if has["torch "]:
            t, c = best(name, "torch ")
            cells.append(f"{t:,.0f} ({c.split()[1]})")
        if has["tf.data"]:
            cells.append(f"{med[name, 'tf.data']:,.0f}")
        cells += [f"{io:,.0f}", f"{ideal:,.0f}", f"{d / ideal:.2f}", f"{auto / ideal:.2f}"]
        if has["io_depth="]:
            cells.append(f"{dep / ideal:.2f}")
        if has["torch "]:
            cells.append(f"{d / t:.2f}")
            if has["io_depth="]:
                cells.append(f"{dep / t:.2f}")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
