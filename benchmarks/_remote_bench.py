"""The remote rows of ``benchmarks/storage.py`` (``--remote``): the same chain reading the
photos over HTTP (nginx) and S3 (moto's server) with a round trip of ``--rtts`` ms.

Layouts, one row each per protocol and round trip:

* ``records``: ``.llrec``/``.llidx`` shards written by ``ll.write_records``;
* ``webdataset``: ``.tar`` shards of ``KEY.jpg`` + ``KEY.cls``;
* ``objects``: one object per image (``ImageListDataset`` with a URL ``root``);

the shard layouts twice: samples read by byte range, and through the shard cache
(``cache_dir=`` a fresh folder per measurement, so cold).

Latency: a network namespace holding the servers, joined to this one by a veth pair per round
trip whose ends ``tc netem`` delays (half the round trip each way, +-``--jitter`` per packet);
where that cannot be set up (no root, no iproute2, no ``sch_netem``), a proxy on 127.0.0.1
that holds each request for one round trip +-``--jitter`` (``_servers.DelayProxy``). The
output says which ran and why.

Columns:

* ``loaderlib default`` and ``AUTOTUNE``: as in the local rows. A ranges row is timed like
  them (a warm-up epoch, then ``--epochs``); a cache row is one cold epoch timed from the
  dataset's construction (its downloads start there) to the last batch;
* ``PyTorch``: its DataLoader at its best of ``--torch-workers``, whose dataset reads the same
  URLs through obstore (the library loaderlib uses), one request per sample (a byte range of
  the shard, or the object), decodes with OpenCV and applies the same transforms. It has no
  shard cache: a cache row shows the ranges row's figure;
* ``ideal`` = min(CPU ceiling, IO ceiling): the CPU ceiling is the best loaderlib column on
  the same layout's local files in the page cache (the ``local`` rows); the IO ceiling is
  what the store serves at that latency with no decoding, ``--io-conc`` Python threads
  calling obstore after one warm-up request per thread: one request per sample (a byte range
  of its shard, or its object; the list cycled to at least 2,048 requests), and for the shard
  layouts also every shard downloaded whole at once; the faster of the two, in images/s (the
  whole shards are the bound for a reader that coalesces neighbouring ranges). A cache row
  shares its ranges row's IO ceiling.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time

from loader import BATCH, image_files

LAYOUTS = ("records", "webdataset", "objects")
BUCKET = "bench"
MIN_IO_REQUESTS = 2048


# --------------------------------------------------------------------------- the data


def build_layouts(root: str, out: str, shards: int) -> dict:
    """The photos of the ImageFolder ``root`` in the three layouts under ``out`` (made once per
    size and shard count): returns, per layout, the samples as ``(object name, start, end,
    label)`` in the dataset's order (``start``/``end`` None: the whole object)."""
    import loaderlib as ll

    paths, labels = image_files(root)
    done = os.path.join(out, "samples.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    names = []
    for p in paths:
        rel = os.path.relpath(p, root).replace(os.sep, "/")
        os.makedirs(os.path.dirname(os.path.join(out, "img", rel)), exist_ok=True)
        shutil.copyfile(p, os.path.join(out, "img", rel))
        names.append("img/" + rel)
    total = sum(map(os.path.getsize, paths))
    ll.write_records(os.path.join(out, "rec"), paths, labels, shard_size=total // shards + 1)
    rec = ll.RecordFileDataset(sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".llrec")))
    records = [(os.path.basename(rec.paths[s]), int(o), int(o) + int(n), int(lab))
               for s, o, n, lab in zip(rec.shard_of, rec.offsets, rec.sizes, rec.labels)]
    per = -(-len(paths) // shards)
    wds = []
    for s in range(shards):
        name = f"wds-{s}.tar"
        with tarfile.open(os.path.join(out, name), "w") as tf:
            for i in range(s * per, min(len(paths), (s + 1) * per)):
                for ext, data in (("jpg", open(paths[i], "rb").read()), ("cls", str(labels[i]).encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        with tarfile.open(os.path.join(out, name)) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".jpg"):
                    wds.append((name, m.offset_data, m.offset_data + m.size, labels[int(m.name[:6])]))
    samples = {"records": records, "webdataset": wds,
               "objects": [(n, None, None, lab) for n, lab in zip(names, labels)],
               "record_shards": len(rec.paths), "wds_shards": shards}
    with open(done, "w") as f:
        json.dump(samples, f)
    return samples


# --------------------------------------------------------------------------- one measurement (child)


def _loaderlib_dataset(spec: dict, cache_dir: str | None):
    import loaderlib as ll

    base, so, layout = spec["base"], spec["storage_options"], spec["layout"]
    remote = {} if spec["local"] else {"storage_options": so, "cache_dir": cache_dir}
    if layout == "records":
        names = [f"{base}/rec-{k:05d}.llrec" for k in range(spec["record_shards"])]
        return ll.RecordFileDataset(names if spec["local"] else f"{base}/rec-{{00000..{len(names) - 1:05d}}}.llrec",
                                    **remote)
    if layout == "webdataset":
        names = [f"{base}/wds-{k}.tar" for k in range(spec["wds_shards"])]
        return ll.WebDataset(names if spec["local"] else f"{base}/wds-{{0..{len(names) - 1}}}.tar", **remote)
    names = [s[0] for s in spec["samples"]]
    labels = [s[3] for s in spec["samples"]]
    return ll.ImageListDataset(names, labels, root=base, storage_options=remote.get("storage_options"))


def run_loaderlib(spec: dict) -> dict:
    from _epochs import timed_epochs
    from loader import rn50_chain

    import loaderlib as ll

    kw = {"num_threads": ll.AUTOTUNE} if spec["threads"] == "autotune" else {}

    def loader_of(ds):
        return ll.DataLoader(ds.transform_first(rn50_chain("uint8")), batch_size=BATCH, shuffle=True, seed=0,
                             last_batch="discard", **kw)

    if not spec["cache"]:
        ds = _loaderlib_dataset(spec, None)
        loader = loader_of(ds)
        res = timed_epochs(lambda: loader, spec["epochs"], None)
        res["num_threads"] = getattr(loader, "num_threads", None)
        return res
    cache = tempfile.mkdtemp(prefix="ll-remote-cache-")
    try:
        t0 = time.perf_counter()
        ds = _loaderlib_dataset(spec, cache)
        loader = loader_of(ds)
        n = sum(len(x) for x, _y in loader)
        res = {"images_per_s": n / (time.perf_counter() - t0), "images": n, "num_threads": loader.num_threads}
        loader.close()
        getattr(ds, "close", lambda: None)()
        return res
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _store(spec: dict):
    """An obstore store for ``spec['base']``, opened in the calling process."""
    import obstore

    client = {"allow_http": True}
    if spec["base"].startswith("s3://"):
        so = spec["storage_options"]
        return obstore.store.S3Store(spec["base"][len("s3://"):], endpoint=so["endpoint_url"],
                                     access_key_id=so["aws_access_key_id"],
                                     secret_access_key=so["aws_secret_access_key"], region=so["region_name"],
                                     client_options=client)
    return obstore.store.HTTPStore.from_url(spec["base"], client_options=client)


def _read(store, sample) -> bytes:
    import obstore

    name, start, end, _label = sample
    if start is None:
        return obstore.get(store, name).bytes()
    return obstore.get_range(store, name, start=start, end=end)


def run_torch(spec: dict) -> dict:
    import cv2
    import numpy as np
    import torch
    from _epochs import timed_epochs
    from loader import CvPipeline

    cv2.setNumThreads(1)
    samples = spec["samples"]

    class Remote(torch.utils.data.Dataset):
        """One obstore request per sample (opened per worker process), OpenCV decode, the chain."""

        def __init__(self) -> None:
            self.store = self.pipe = None

        def __len__(self) -> int:
            return len(samples)

        def __getitem__(self, i: int):
            if self.store is None:
                info = torch.utils.data.get_worker_info()
                self.store = _store(spec)
                self.pipe = CvPipeline("uint8", seed=0 if info is None else info.id + 1)
            pipe = self.pipe
            img = cv2.imdecode(np.frombuffer(memoryview(_read(self.store, samples[i])), np.uint8), cv2.IMREAD_COLOR)
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
            y, x, ch, cw = pipe.crop_box(*img.shape[:2])
            img = cv2.resize(img[y:y + ch, x:x + cw], (224, 224), interpolation=cv2.INTER_LINEAR)
            if pipe.rng.random() < 0.5:
                img = img[:, ::-1]
            return torch.from_numpy(np.ascontiguousarray(img)), samples[i][3]

    loader = torch.utils.data.DataLoader(Remote(), batch_size=BATCH, shuffle=True, num_workers=spec["workers"],
                                         drop_last=True, persistent_workers=True)
    return timed_epochs(lambda: loader, spec["epochs"], None)


def run_io(spec: dict) -> dict:
    """The IO ceiling: requests only, ``io_conc`` threads (module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore

    store = _store(spec)
    samples = spec["samples"]
    conc = spec["io_conc"]
    out = {}
    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(lambda s: _read(store, s), [samples[k % len(samples)] for k in range(conc)]))   # connections
        todo = [samples[k % len(samples)] for k in range(max(len(samples), MIN_IO_REQUESTS))]
        t0 = time.perf_counter()
        sum(pool.map(lambda s: len(memoryview(_read(store, s))), todo))
        out["per_sample"] = len(todo) / (time.perf_counter() - t0)
        if spec["layout"] != "objects":
            shards = sorted({s[0] for s in samples})
            t0 = time.perf_counter()
            sum(pool.map(lambda name: len(obstore.get(store, name).bytes()), shards))
            out["whole_shards"] = len(samples) / (time.perf_counter() - t0)
    out["images_per_s"] = max(out.values())
    return out


def child(spec_path: str) -> dict:
    with open(spec_path) as f:
        spec = json.load(f)
    return {"loaderlib": run_loaderlib, "torch": run_torch, "io": run_io}[spec["kind"]](spec)


# --------------------------------------------------------------------------- parent


class Network:
    """Where the servers run and how latency is added: netem (namespace) or the delay proxy."""

    def __init__(self, stack: contextlib.ExitStack, serve: str, rtts: list[float], jitter: float, mode: str,
                 protocols: list[str]) -> None:
        import _servers

        self.how = ""
        self.netem = None
        if mode in ("auto", "netem"):
            try:
                self.netem = _servers.NetemNetwork(rtts, jitter)
                stack.callback(self.netem.close)
            except (RuntimeError, OSError) as e:
                if mode == "netem":
                    raise
                self.why_not = str(e)
        where = {"host": "0.0.0.0", "prefix": self.netem.prefix, "reach": self.netem.host(rtts[0])} if self.netem \
            else {}
        self.nginx = self.moto = None
        if "http" in protocols:
            self.nginx = _servers.NginxServer(serve, **where)
            stack.callback(self.nginx.close)
        if "s3" in protocols:
            self.moto = _servers.MotoServer(**where)
            stack.callback(self.moto.close)
        self.origin: dict[tuple[str, float], str] = {}
        if self.netem:
            for rtt in rtts:
                h = self.netem.host(rtt)
                if self.nginx:
                    self.origin["http", rtt] = f"http://{h}:{self.nginx.port}"
                if self.moto:
                    self.origin["s3", rtt] = f"http://{h}:{self.moto.port}"
            self.how = (f"latency: tc netem in network namespace {self.netem.name}, one veth pair per round trip "
                        f"(half of it each way, +-{jitter:.0%} per packet, order kept): "
                        + "; ".join(self.netem.commands))
        else:
            self.proxies = {}
            for proto, server in (("http", self.nginx), ("s3", self.moto)):
                if server is None:
                    continue
                for k, rtt in enumerate(rtts):
                    p = _servers.DelayProxy(server.url if proto == "http" else server.endpoint_url, rtt, jitter,
                                            seed=k)
                    stack.callback(p.close)
                    self.origin[proto, rtt] = p.url
            self.how = ("latency: the delay proxy (benchmarks/_servers.py DelayProxy, asyncio, in this process) on "
                        f"127.0.0.1: each request is held for one round trip x uniform[{1 - jitter:g}, {1 + jitter:g}] "
                        "before it is forwarded; connections cost no round trip and bodies flow at loopback speed. "
                        f"netem was not used: {getattr(self, 'why_not', 'asked for the proxy (--net proxy)')}")

    def base(self, proto: str, rtt: float) -> tuple[str, dict | None]:
        """The dataset's URL prefix and storage_options for ``proto`` at ``rtt``."""
        origin = self.origin[proto, rtt]
        if proto == "http":
            return origin, None
        m = self.moto
        return f"s3://{BUCKET}", {"endpoint_url": origin, "aws_access_key_id": m.key,
                                  "aws_secret_access_key": m.secret, "region_name": m.region}


def versions(net: Network) -> str:
    out = []
    if net.nginx:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        v = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False).stderr.strip()
        out.append(v.replace("nginx version: ", ""))
    if net.moto:
        import moto

        out.append(f"moto server {moto.__version__}")
    import obstore

    out.append(f"obstore {obstore.__version__}")
    return ", ".join(out)


def main(a, root: str, measure_spec, summary: str, split: str | None = None) -> None:
    """Run the remote rows (``a``: storage.py's arguments; ``measure_spec(spec) -> dict`` runs one
    child; ``summary``: the machine, from ``_report.machine_summary``; ``split``: the line
    saying which CPUs the servers and loaders have, None when they share them)."""
    rtts = [float(x) for x in a.rtts.split(",") if x]
    protocols = [x for x in a.protocols.split(",") if x]
    layouts = [x for x in a.layouts.split(",") if x]
    bad = set(layouts) - set(LAYOUTS) | set(protocols) - {"http", "s3"}
    if bad:
        raise SystemExit(f"unknown layouts or protocols: {sorted(bad)}")
    workers = [int(x) for x in a.torch_workers.split(",") if x]
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not installed: the PyTorch column is left out (make .venv/.loaderlib-test-deps)")
    serve = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                         f"remote-{os.path.basename(root.rstrip(os.sep))}-{a.shards}")
    samples = build_layouts(root, serve, a.shards)
    n = len(samples["objects"])
    common = {"record_shards": samples["record_shards"], "wds_shards": samples["wds_shards"], "epochs": a.epochs,
              "io_conc": a.io_conc}

    with contextlib.ExitStack() as stack:
        net = Network(stack, serve, rtts, a.jitter, a.net, protocols)
        if net.moto:
            net.moto.upload_folder(BUCKET, serve)
        print(summary)
        print(f"remote storage benchmark: {n} JPEGs from {root}, as {samples['record_shards']} record shards, "
              f"{samples['wds_shards']} WebDataset shards and {n} objects; RandomResizedCrop(224) + flip, HWC uint8, "
              f"batch {BATCH}; each loader in a fresh process; median of {a.repeat} interleaved round(s); "
              f"{len(os.sched_getaffinity(0))} usable cores, load average {os.getloadavg()[0]:.1f} at the start")
        print(net.how)
        print(f"servers: {versions(net)}; nginx and moto run on this machine; "
              + (split or "they share its cores with the loaders"))

        # (row name, layout, protocol or None for local, rtt, cache)
        rows = [(f"local {lay} (page cache)", lay, None, 0.0, False) for lay in layouts]
        for proto in protocols:
            for rtt in rtts:
                for lay in layouts:
                    for cache in ((False, True) if lay != "objects" else (False,)):
                        how = "cache (cold)" if cache else ("objects" if lay == "objects" else "ranges")
                        rows.append((f"{proto} {rtt:g} ms {lay}, {how}", lay, proto, rtt, cache))

        def spec(kind: str, lay: str, proto: str | None, rtt: float, cache: bool, **kw) -> dict:
            base, so = (serve, None) if proto is None else net.base(proto, rtt)
            return {**common, "kind": kind, "layout": lay, "base": base, "storage_options": so, "cache": cache,
                    "local": proto is None, "samples": samples[lay], **kw}

        runs: dict = {}
        t_run = time.perf_counter()
        for r in range(a.repeat):
            for name, lay, proto, rtt, cache in rows:
                cells = [("loaderlib default", spec("loaderlib", lay, proto, rtt, cache, threads="default")),
                         ("loaderlib AUTOTUNE", spec("loaderlib", lay, proto, rtt, cache, threads="autotune"))]
                if proto is not None and not cache:
                    cells += [(f"torch {w}w", spec("torch", lay, proto, rtt, cache, workers=w))
                              for w in (workers if have_torch else [])]
                if proto is not None and not cache:
                    cells.append(("io ceiling", spec("io", lay, proto, rtt, cache)))
                for col, sp in cells:
                    res = measure_spec(sp)
                    runs.setdefault((name, col), []).append(res["images_per_s"])
                    if col == "loaderlib default" and "cpu_ms_per_image" in res:
                        runs.setdefault((name, "cpu default"), []).append(res["cpu_ms_per_image"])
                    for part in ("per_sample", "whole_shards"):
                        if part in res:
                            runs.setdefault((name, f"io {part.replace('_', ' ')}"), []).append(res[part])
                    print(f"  round {r + 1}: {name} / {col}: {res['images_per_s']:,.0f} img/s", flush=True)
            print(f"round {r + 1} of {a.repeat} done ({time.perf_counter() - t_run:.0f} s; load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
            print_table(runs, rows, workers if have_torch else [],
                        f"medians of {r + 1} round(s)" + ("" if r + 1 == a.repeat else " (so far)"))
    print(net.how)
    print("\nevery cell, images/s per round: " + "; ".join(
        f"{k[0]} / {k[1]}: " + ", ".join(f"{x:.3f} ms/img" if k[1] == "cpu default" else f"{x:.0f}" for x in v)
        for k, v in runs.items()))


def print_table(runs: dict, rows: list, workers: list[int], title: str) -> None:
    """One row per source; cells are median images/s; ratios are of the loaderlib columns."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = {lay: max(med[name, c] for c in ("loaderlib default", "loaderlib AUTOTUNE"))
           for name, lay, proto, _r, _c in rows if proto is None}
    print(f"\n== {title}. CPU ceiling: the best loaderlib column on the layout's local files (page cache). "
          "IO ceiling: the store's requests alone at that latency, one per sample or whole shards, the faster "
          "(benchmarks/_remote_bench.py says how). "
          "ideal = min(CPU ceiling, IO ceiling); a cache row is one cold epoch from the dataset's construction; "
          "PyTorch reads by ranges or objects (no cache: a cache row repeats its ranges row's figure, in brackets). "
          "default CPU: the default loader's process CPU time per image over the timed epochs (all its threads; "
          "on the local rows, what the same chain costs without a store).\n")
    head = ["source", "loaderlib default", "AUTOTUNE"] + (["PyTorch (best)"] if workers else [])
    head += ["CPU ceiling", "IO ceiling", "ideal", "default x ideal", "AUTOTUNE x ideal", "default CPU ms/img"]
    head += ["default x torch", "AUTOTUNE x torch"] if workers else []
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for name, lay, proto, rtt, cache in rows:
        d, auto = med[name, "loaderlib default"], med[name, "loaderlib AUTOTUNE"]
        cells = [name, f"{d:,.0f}", f"{auto:,.0f}"]
        t = None
        if workers and proto is not None:
            src = name.replace("cache (cold)", "ranges") if cache else name
            t, w = max((med[src, f"torch {w}w"], w) for w in workers)
            cells.append(f"[{t:,.0f} ({w})]" if cache else f"{t:,.0f} ({w})")
        elif workers:
            cells.append("")
        io_c = med.get((name.replace("cache (cold)", "ranges"), "io ceiling"))
        ideal = cpu[lay] if io_c is None else min(cpu[lay], io_c)
        c_ms = med.get((name, "cpu default"))
        cells += [f"{cpu[lay]:,.0f}", "" if io_c is None else f"{io_c:,.0f}", f"{ideal:,.0f}",
                  f"{d / ideal:.2f}", f"{auto / ideal:.2f}", "" if c_ms is None else f"{c_ms:.3f}"]
        if workers:
            cells += [f"{d / t:.2f}", f"{auto / t:.2f}"] if t else ["", ""]
        print("| " + " | ".join(cells) + " |", flush=True)
