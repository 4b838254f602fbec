"""Cold and warm epochs from S3: loaderlib's shard cache against MosaicML Streaming and LitData.

The same photos (``benchmarks/_photos.py``, ImageNet-like by default) are written into each
system's own shard format, with the same shard size:

* loaderlib: record shards (``ll.write_records(..., shard_size=)``, ``.llrec`` + ``.llidx``),
  read with ``RecordFileDataset("s3://...", cache_dir=...)``, the shard cache;
* MosaicML Streaming: MDS shards (``streaming.MDSWriter``, columns ``image: bytes``,
  ``label: int``, ``size_limit=``), read with ``streaming.StreamingDataset(remote=, local=)``;
* LitData: optimized chunks (``litdata.optimize(..., chunk_bytes=)``, each sample
  ``(JPEG bytes, label)``), read with ``litdata.StreamingDataset(..., cache_dir=)``.

Each is uploaded under its own prefix of one bucket of moto's S3 server
(``benchmarks/_servers.py`` ``MotoServer``, a Python process on 127.0.0.1 of this machine; with
``--storage-cpus`` on CPUs of its own). Every sample gets the same work: JPEG decode,
``RandomResizedCrop(224)`` (torchvision's box), horizontal flip with probability 1/2, and
``Normalize`` to CHW float32; batches of 64, an infinitely fast model (batches are consumed and
dropped). loaderlib runs its native chain (default threads); the peers run the work in their
PyTorch DataLoader workers with OpenCV (``cv2.imdecode``, ``cv2.resize`` bilinear, numpy
normalize), as a user of them would, at their best of ``--workers`` (persistent workers): the first
``--sweep-rounds`` rounds try every count, the later ones run each peer at its best there.

One measurement is one fresh process with an empty local cache folder: the **cold** epoch is
timed from the dataset's construction (its index requests included) to the last batch; the
**warm** epoch is the next epoch of the same loader, from ``iter()`` to the last batch, reading
the local copies. Shuffling: each system's default shuffle (``shuffle=True``; Streaming's
``py1e`` over one block of the whole dataset here, LitData's chunk-order shuffle) and, for
loaderlib, ``ShardShuffleSampler`` too (shard order, a 1,024-sample buffer) when
``--ll-samplers`` names it. Rounds are interleaved (every cell once per round, in a rotating
order); medians are reported, and per round loaderlib's figure over the faster peer's in
the same round (the machine's load drifts between rounds: a ratio within a round compares
runs made minutes apart at most), with the lowest of those ratios. The sweep rounds only
choose the peers' worker counts: once later rounds exist, they alone make the table. (Counted,
a sweep round would set loaderlib's single run against the best of the peer's runs at every
count in that round, a maximum of several noisy samples, which biased its ratio low.) The process tree's CPU
(``getrusage`` of the measured process and its workers) and moto's CPU during the measurement
are reported per image, with the load average.

Usage::

    python benchmarks/objstore_peers.py --peers .venv-objpeers/bin/python      # make bench-storage-peers
    python benchmarks/objstore_peers.py --images 512 --repeat 1 --workers 2     # a short run
    python benchmarks/objstore_peers.py --storage-cpus 1                        # moto on CPU 1, loaders on CPU 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

BATCH = 64
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BUCKET = "objpeers"
SYSTEMS = ("loaderlib", "streaming", "litdata")


# --------------------------------------------------------------------------- per-sample work (peers)


class CvTrain:
    """Decode + RandomResizedCrop(224) + flip + Normalize to CHW float32 with OpenCV and numpy:
    what a user of Streaming or LitData writes in the dataset's ``__getitem__``."""

    def __init__(self, seed: int) -> None:
        import random

        import numpy as np

        self.rng = random.Random(seed)
        self.mean = np.array(MEAN, np.float32) * 255
        self.inv_std = 1.0 / (np.array(STD, np.float32) * 255)

    def box(self, h: int, w: int) -> tuple[int, int, int, int]:
        """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3)."""
        import math

        area = h * w
        for _ in range(10):
            target = area * self.rng.uniform(0.08, 1.0)
            ar = math.exp(self.rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
            if 0 < cw <= w and 0 < ch <= h:
                return self.rng.randint(0, h - ch), self.rng.randint(0, w - cw), ch, cw
        ratio = w / h
        if ratio < 3 / 4:
            cw, ch = w, round(w / (3 / 4))
        elif ratio > 4 / 3:
            ch, cw = h, round(h * (4 / 3))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, data) -> object:
        import cv2
        import numpy as np

        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        y, x, ch, cw = self.box(*img.shape[:2])
        img = cv2.resize(img[y:y + ch, x:x + cw], (224, 224), interpolation=cv2.INTER_LINEAR)
        if self.rng.random() < 0.5:
            img = img[:, ::-1]
        out = (img.astype(np.float32) - self.mean) * self.inv_std
        return np.ascontiguousarray(out.transpose(2, 0, 1))


def _torchvision_importable() -> None:
    """Streaming imports torchvision (its vision datasets) when it is imported; beside torch's
    CPU wheel that import fails unless torchvision's op registration is stubbed (NOTE
    [ torchvision beside CPU torch ] in _torchvision.py). Nothing here calls those ops."""
    from _torchvision import import_torchvision

    try:
        import_torchvision()
    except ImportError:
        pass


def _worker_transform():
    import torch

    info = torch.utils.data.get_worker_info()
    return CvTrain(0 if info is None else info.id + 1)


# --------------------------------------------------------------------------- writers (child)


def write_peers(spec: dict) -> dict:
    """Streaming's MDS shards and LitData's chunks of the photos (run in the peers' interpreter)."""
    paths, labels, size = spec["paths"], spec["labels"], spec["shard_bytes"]
    out = {}
    if "streaming" in spec["systems"]:
        _torchvision_importable()
        from streaming import MDSWriter

        with MDSWriter(out=spec["mds"], columns={"image": "bytes", "label": "int"}, size_limit=size,
                       compression=None) as w:
            for p, lab in zip(paths, labels):
                with open(p, "rb") as f:
                    w.write({"image": f.read(), "label": int(lab)})
        out["streaming"] = sorted(os.listdir(spec["mds"]))
    if "litdata" in spec["systems"]:
        import litdata

        litdata.optimize(fn=_litdata_item, inputs=list(zip(paths, labels)), output_dir=spec["litdata"],
                         chunk_bytes=size, num_workers=1, mode="overwrite")
        out["litdata"] = sorted(os.listdir(spec["litdata"]))
    return out


def _litdata_item(item):
    path, label = item
    with open(path, "rb") as f:
        return f.read(), int(label)


# --------------------------------------------------------------------------- one measurement (child)


def _epochs(make_loader, t_start: float) -> dict:
    """Cold epoch from ``t_start`` (before the dataset was made) and the warm epoch after it."""
    loader = make_loader()
    out = {}
    for name in ("cold", "warm"):
        t0 = t_start if name == "cold" else time.perf_counter()
        n, first = 0, None
        for x, _y in loader:
            n += len(x)
            if first is None:
                first = time.perf_counter() - t0
        out[name] = n / (time.perf_counter() - t0)
        out[f"{name}_images"] = n
        out[f"{name}_first_batch_s"] = first
    return out


def run_loaderlib(spec: dict) -> dict:
    import loaderlib as ll
    from loaderlib import transforms as T
    from loaderlib.sampler import ShardShuffleSampler

    chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD), T.ToCHW()])
    t_start = time.perf_counter()
    so = dict(spec["storage_options"], **({"ranges_while_caching": True} if spec.get("ranges") else {}))
    ds = ll.RecordFileDataset(spec["url"], storage_options=so, cache_dir=spec["cache"])
    kw: dict = {"shuffle": True}
    if spec["sampler"] == "shards":
        kw = {"sampler": ShardShuffleSampler(ds.shard_sizes, buffer_size=1024, seed=0)}
    its: list = []

    def make():
        loader = ll.DataLoader(ds.transform_first(chain), batch_size=BATCH, seed=0, last_batch="discard", **kw)
        spec["_loader"] = loader

        class Epochs:
            def __iter__(self):
                its.append(iter(loader))
                return its[-1]
        return Epochs()

    res = _epochs(make, t_start)
    loader = spec.pop("_loader")
    res["num_threads"] = loader.num_threads
    res["shards_opened"] = ds._remote.opened
    loader.close()
    ds.close()
    return res


def run_streaming(spec: dict) -> dict:
    import numpy as np
    import torch

    _torchvision_importable()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    so = spec["storage_options"]
    os.environ.update({"S3_ENDPOINT_URL": so["endpoint_url"], "AWS_ACCESS_KEY_ID": so["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": so["aws_secret_access_key"], "AWS_DEFAULT_REGION": so["region_name"]})

    class Train(StreamingDataset):
        def get_item(self, idx: int):
            obj = super().get_item(idx)
            if not hasattr(self, "_tf"):
                self._tf = _worker_transform()
            return torch.from_numpy(self._tf(np.frombuffer(obj["image"], np.uint8))), obj["label"]

    t_start = time.perf_counter()
    ds = Train(remote=spec["url"], local=spec["cache"], shuffle=True, shuffle_seed=0, batch_size=BATCH)

    def make():
        return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=spec["workers"], drop_last=True,
                                           persistent_workers=True)

    return _epochs(make, t_start)


def run_litdata(spec: dict) -> dict:
    import numpy as np
    import torch
    from litdata import StreamingDataLoader, StreamingDataset

    so = spec["storage_options"]
    # LitData downloads chunks with obstore when it is installed (its fast path), with fixed
    # client options that refuse a plain-http endpoint such as moto's ("BadScheme"): allow it.
    try:
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True   # type: ignore[index]
    except (ImportError, AttributeError, TypeError):
        os.environ["AWS_ALLOW_HTTP"] = "true"

    class Train(StreamingDataset):
        def __getitem__(self, index):
            data, label = super().__getitem__(index)
            if not hasattr(self, "_tf"):
                self._tf = _worker_transform()
            return torch.from_numpy(self._tf(np.frombuffer(data, np.uint8))), label

    t_start = time.perf_counter()
    ds = Train(spec["url"], cache_dir=spec["cache"], shuffle=True, seed=0, drop_last=True,
               storage_options={"endpoint_url": so["endpoint_url"], "aws_access_key_id": so["aws_access_key_id"],
                                "aws_secret_access_key": so["aws_secret_access_key"],
                                "region_name": so["region_name"]})

    def make():
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=spec["workers"], drop_last=True,
                                   persistent_workers=True)

    return _epochs(make, t_start)


def child(spec_path: str) -> dict:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["kind"] == "write":
        return write_peers(spec)
    import cv2

    cv2.setNumThreads(1)
    return {"loaderlib": run_loaderlib, "streaming": run_streaming, "litdata": run_litdata}[spec["kind"]](spec)


# --------------------------------------------------------------------------- parent


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_child(python: str, spec: dict, timeout: float, moto_pid: int | None = None) -> dict:
    """``spec`` in a fresh process of ``python`` (loaderlib imported from this tree, or from
    ``spec["pythonpath"]``); adds the process tree's and moto's CPU seconds."""
    import storage

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    first = spec.get("pythonpath") or ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([first, HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    moto0 = _cpu_of(moto_pid) if moto_pid else 0.0
    try:
        out = subprocess.run(storage.on_loader_cpus([python, os.path.abspath(__file__), "--child", f.name]),
                             capture_output=True, text=True, timeout=timeout, env=env, check=False)
    finally:
        os.unlink(f.name)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{spec['kind']} failed (exit {out.returncode}): {out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if moto_pid:
        res["moto_cpu_s"] = _cpu_of(moto_pid) - moto0
    return res


def main() -> None:
    from _photos import add_data_kind, describe, photos_for

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder of JPEGs (default: generated photos)")
    p.add_argument("--images", type=int, default=2000, help="photos to generate when --data is not given")
    add_data_kind(p)
    p.add_argument("--shard-mb", type=float, default=24.0, help="shard size of every format, MB")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--workers", default="2,4,8", help="DataLoader worker counts the peers are tried at")
    p.add_argument("--sweep-rounds", type=int, default=1,
                   help="rounds that try every worker count; later rounds run each peer at its best of them")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="which of loaderlib, streaming, litdata")
    p.add_argument("--ll-samplers", default="global,shards",
                   help="loaderlib's shuffles: global (shuffle=True), shards (ShardShuffleSampler)")
    p.add_argument("--peers", default=os.path.join(ROOT, ".venv-objpeers", "bin", "python"),
                   help="an interpreter with mosaicml-streaming and litdata (make bench-storage-peers builds it)")
    p.add_argument("--ll-ranges", action="store_true",
                   help="also run loaderlib with storage_options ranges_while_caching=True (samples of shards still "
                        "downloading read by range): the rows named '... ranges'")
    p.add_argument("--storage-cpus", metavar="CPUS",
                   help="moto on these CPUs (1; auto: the last quarter) and every loader on the others")
    p.add_argument("--baseline", metavar="DIR",
                   help="also run loaderlib from DIR (another checkout with its extensions built, e.g. a git "
                        "worktree of main), interleaved with this tree's: the rows named 'baseline'")
    p.add_argument("--timeout", type=float, default=900, help="seconds one measurement may take")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return

    import _servers
    import storage
    from _report import machine_summary

    import loaderlib as ll

    summary = machine_summary()
    split = storage.split_cpus(a.storage_cpus) if a.storage_cpus else None
    systems = [s for s in a.systems.split(",") if s]
    samplers = [s for s in a.ll_samplers.split(",") if s]
    workers = [int(w) for w in a.workers.split(",") if w]
    bad = set(systems) - set(SYSTEMS) | set(samplers) - {"global", "shards"}
    if bad:
        raise SystemExit(f"unknown systems or samplers: {sorted(bad)}")
    peers = [s for s in systems if s != "loaderlib"]
    if peers and not os.path.exists(a.peers):
        raise SystemExit(f"no peers interpreter at {a.peers}: make bench-storage-peers builds it, or pass --peers")

    base = os.path.join(HERE, "out", "objstore-peers")
    root = photos_for(a, a.images, os.path.join(HERE, ".data"))
    from loader import image_files

    paths, labels = image_files(root)
    shard_bytes = int(a.shard_mb * 1e6)
    total = sum(os.path.getsize(x) for x in paths)   # the folder's name and size key the shards made from it
    data = os.path.join(base, f"{os.path.basename(root.rstrip(os.sep))}-{len(paths)}-{total}-{shard_bytes}")
    dirs = {"loaderlib": os.path.join(data, "ll"), "streaming": os.path.join(data, "mds"),
            "litdata": os.path.join(data, "litdata")}
    done = {s: os.path.join(data, f"done-{s}") for s in SYSTEMS}    # each format written once
    if "loaderlib" in systems and not os.path.exists(done["loaderlib"]):
        shutil.rmtree(dirs["loaderlib"], ignore_errors=True)
        os.makedirs(dirs["loaderlib"])
        ll.write_records(os.path.join(dirs["loaderlib"], "train"), paths, labels, shard_size=shard_bytes)
        open(done["loaderlib"], "w").close()
    todo = [s for s in peers if not os.path.exists(done[s])]
    if todo:
        for s in todo:
            shutil.rmtree(dirs[s], ignore_errors=True)
            os.makedirs(dirs[s])
        run_child(a.peers, {"kind": "write", "systems": todo, "paths": paths, "labels": labels,
                            "shard_bytes": shard_bytes, "mds": dirs["streaming"], "litdata": dirs["litdata"]},
                  a.timeout)
        for s in todo:
            open(done[s], "w").close()

    def files(s: str) -> tuple[int, int]:
        names = os.listdir(dirs[s])
        big = [n for n in names if n.endswith((".llrec", ".mds", ".bin"))]
        return len(big), sum(os.path.getsize(os.path.join(dirs[s], n)) for n in big)

    with contextlib.ExitStack() as stack:
        moto = _servers.MotoServer()
        stack.callback(moto.close)
        for s in systems:
            moto.upload_folder(BUCKET, dirs[s], prefix=f"{s}/")
        n_ll = len([x for x in os.listdir(dirs["loaderlib"]) if x.endswith(".llrec")])
        urls = {"loaderlib": f"s3://{BUCKET}/loaderlib/train-{{00000..{n_ll - 1:05d}}}.llrec",
                "streaming": f"s3://{BUCKET}/streaming", "litdata": f"s3://{BUCKET}/litdata"}
        print(summary)
        print(describe(root))
        print(f"object-store peers: {len(paths)} JPEGs as shards of about {a.shard_mb:g} MB in each system's format: "
              + "; ".join(f"{s} {files(s)[0]} shards, {files(s)[1] / 1e6:.1f} MB" for s in systems))
        import moto as moto_pkg

        print(f"store: moto's S3 server {moto_pkg.__version__} (pid {moto.proc.pid}) on 127.0.0.1 of this machine; "
              + (split or f"it shares the {len(os.sched_getaffinity(0))} cores with the loaders"))
        print("work per sample: decode + RandomResizedCrop(224) + flip + Normalize, CHW float32, batch 64, "
              "an infinitely fast model. loaderlib: RecordFileDataset(s3://..., cache_dir=<empty>), default threads; "
              f"peers: OpenCV in their DataLoader's workers (persistent), best of {workers} workers. Cold: dataset "
              "construction to the last batch of epoch 1, local cache emptied; warm: epoch 2 of the same loader. "
              f"Median of {a.repeat} interleaved round(s); load average {os.getloadavg()[0]:.1f} at the start",
              flush=True)

        ll_cells = [(f"loaderlib {smp}", {"kind": "loaderlib", "sampler": smp}) for smp in samplers]
        if a.ll_ranges:
            ll_cells += [(f"loaderlib {smp} ranges", {"kind": "loaderlib", "sampler": smp, "ranges": True})
                         for smp in samplers]
        if a.baseline:
            ll_cells += [(f"baseline {smp}", {"kind": "loaderlib", "sampler": smp, "pythonpath": a.baseline})
                         for smp in samplers]
        runs: dict[str, list[dict]] = {}
        best: dict[str, str] = {}     # peer -> its cell at the best worker count (after the sweep)
        t_run = time.perf_counter()
        for r in range(a.repeat):
            sweep = r < a.sweep_rounds or not best
            if r == a.sweep_rounds and peers:
                best = {s: min((f"{s} {w}w" for w in workers),
                               key=lambda n: statistics.median(1 / x["cold"] + 1 / x["warm"] for x in runs[n]))
                        for s in peers}
                print("best worker counts (median of cold + warm epoch time over the sweep round(s)): "
                      + ", ".join(f"{s} {n.split()[-1][:-1]}" for s, n in best.items()), flush=True)
                sweep = False
            cells = list(ll_cells)
            for s in peers:
                cells += ([(f"{s} {w}w", {"kind": s, "workers": w}) for w in workers] if sweep
                          else [(best[s], {"kind": s, "workers": int(best[s].split()[-1][:-1])})])
            k = r % len(cells)
            for name, cell in cells[k:] + cells[:k]:
                cache = tempfile.mkdtemp(prefix="ll-objpeers-cache-")
                spec = {**cell, "url": urls[cell["kind"]], "storage_options": moto.storage_options, "cache": cache}
                try:
                    res = run_child(sys.executable if cell["kind"] == "loaderlib" else a.peers, spec, a.timeout,
                                    moto.proc.pid)
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                res["load"] = os.getloadavg()[0]
                res["round"] = r
                res["sweep"] = sweep
                runs.setdefault(name, []).append(res)
                print(f"  round {r + 1}: {name}: cold {res['cold']:,.0f} img/s ({res['cold_images']} images, first "
                      f"batch {res['cold_first_batch_s']:.2f} s), warm {res['warm']:,.0f} img/s; CPU "
                      f"{1e3 * res['cpu_s'] / (res['cold_images'] + res['warm_images']):.2f} ms/img, moto "
                      f"{1e3 * res.get('moto_cpu_s', 0) / (res['cold_images'] + res['warm_images']):.2f} ms/img; "
                      f"load {res['load']:.1f}", flush=True)
            print(f"round {r + 1} of {a.repeat} done ({time.perf_counter() - t_run:.0f} s; load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            print_table(runs, samplers, peers, workers, best, r + 1)


def print_table(runs: dict, samplers: list[str], peers: list[str], workers: list[int], best: dict,
                rounds: int) -> None:
    """Medians per cell, each peer at its best worker count (``best``, or while sweeping the best
    so far), and per round the ratio of loaderlib's figure to the best peer's in the same round."""
    measured = any(not x.get("sweep") for rs in runs.values() for x in rs)
    if measured:   # the sweep rounds chose the worker counts; the rounds after them are measured
        runs = {n: [x for x in rs if not x.get("sweep")] for n, rs in runs.items()}
        runs = {n: rs for n, rs in runs.items() if rs}
        rounds = len({x["round"] for rs in runs.values() for x in rs})

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[name])

    def speed(n: str) -> float:
        return statistics.median(1 / x["cold"] + 1 / x["warm"] for x in runs[n])

    chosen = dict(best)
    for s in peers:
        if s not in chosen:
            have = [f"{s} {w}w" for w in workers if f"{s} {w}w" in runs]
            if have:
                chosen[s] = min(have, key=speed)
    names = {"streaming": "MosaicML Streaming", "litdata": "LitData"}
    rows = [(f"{who} ({'shuffle=True' if smp == 'global' else 'ShardShuffleSampler'}{more})", f"{who} {smp}{tail}")
            for who in ("loaderlib", "baseline") for tail, more in (("", ""), (" ranges", ", ranges_while_caching"))
            for smp in samplers if f"{who} {smp}{tail}" in runs]
    rows += [(f"{names[s]} ({n.split()[-1][:-1]} workers)", n) for s, n in chosen.items()]

    def per_round(n: str, key: str) -> list[float]:
        """loaderlib's ``key`` over the best peer's in the same round, per round that has both."""
        out = []
        for x in runs[n]:
            other = [y[key] for p in chosen.values() for y in runs[p] if y["round"] == x["round"]]
            if other:
                out.append(x[key] / max(other))
        return out

    print(f"\n== medians of {rounds} round(s){' after the sweep' if measured else ' (sweep rounds only)'}, images/s "
          "(each peer at its best worker count); 'x best peer': loaderlib over the faster peer in the same round, "
          "median and lowest of the rounds\n")
    print("| loader | cold | warm | cold x best peer (median, lowest) | warm x best peer (median, lowest) "
          "| CPU ms/img (process tree) | moto CPU ms/img |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, n in rows:
        c, w = med(n, "cold"), med(n, "warm")
        imgs = statistics.median(x["cold_images"] + x["warm_images"] for x in runs[n])
        cpu = 1e3 * med(n, "cpu_s") / imgs
        moto = 1e3 * statistics.median(x.get("moto_cpu_s", 0) for x in runs[n]) / imgs
        rc = rw = ""
        if not n.startswith(tuple(peers)) and chosen:
            pc, pw = per_round(n, "cold"), per_round(n, "warm")
            if pc:
                rc = f"{statistics.median(pc):.2f} ({min(pc):.2f})"
                rw = f"{statistics.median(pw):.2f} ({min(pw):.2f})"
        print(f"| {label} | {c:,.0f} | {w:,.0f} | {rc} | {rw} | {cpu:.2f} | {moto:.2f} |")
    for label, n in rows:
        print(f"{label}: cold per round " + ", ".join(f"{x['cold']:,.0f}" for x in runs[n])
              + "; warm " + ", ".join(f"{x['warm']:,.0f}" for x in runs[n])
              + "; load " + ", ".join(f"{x['load']:.1f}" for x in runs[n]))
    print(flush=True)


if __name__ == "__main__":
    main()
