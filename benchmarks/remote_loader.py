"""The ResNet-50 train chain reading the same JPEGs locally, over HTTP (nginx) and from S3
(moto's server), both on 127.0.0.1 (no added latency): record shards by byte range and
through the shard cache, WebDataset shards, and one object per image.

For each source one DataLoader (RandomResizedCrop(224), flip, CHW uint8; batch 64; shuffled;
``--threads``) is consumed by an infinitely fast model for ``--epochs`` epochs; printed: images
per second of the first (cold) epoch and of the last, median of ``--rounds`` interleaved rounds.
moto's server is Python (FACTS: about 365 small objects/s), so its one-object-per-image row
measures moto.

Usage::

    python benchmarks/remote_loader.py [--images 512] [--rounds 3] [--epochs 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tarfile
import tempfile
import time

import _servers
from _photos import add_data_kind, describe
from _photos import jpegs as make_jpegs
from _report import machine_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512)
    add_data_kind(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-depths", default="default",
                    help="comma-separated io_depth values to run each source with: 'default' (None: reads and "
                         "buffers fetched ahead) and/or integers (0: a batch's bytes fetched when it is queued)")
    args = ap.parse_args()
    depths = [None if d == "default" else int(d) for d in args.io_depths.split(",")]

    import loaderlib as ll
    from loaderlib import transforms as T

    root = tempfile.mkdtemp(prefix="ll-remote-bench-")
    jpegs = make_jpegs(args.images, args.data_kind)
    print(describe(jpegs, args.data_kind), flush=True)
    labels = [i % 10 for i in range(args.images)]
    os.makedirs(os.path.join(root, "img"))
    for i, data in enumerate(jpegs):
        with open(os.path.join(root, "img", f"{i:05d}.jpg"), "wb") as f:
            f.write(data)
    ll.write_records(os.path.join(root, "rec"), jpegs, labels, shard_size=len(b"".join(jpegs)) // 4)
    nrec = len([n for n in os.listdir(root) if n.endswith(".llrec")])
    per = (args.images + 3) // 4
    for s in range(4):
        with tarfile.open(os.path.join(root, f"wds-{s}.tar"), "w") as tf:
            for i in range(s * per, min(args.images, (s + 1) * per)):
                for ext, data in (("jpg", jpegs[i]), ("cls", str(labels[i]).encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    nginx = _servers.NginxServer(root)
    moto = _servers.MotoServer()
    cache_root = tempfile.mkdtemp(prefix="ll-remote-cache-")
    try:
        moto.upload_folder("bench", root)
        so = moto.storage_options
        rec = f"rec-{{00000..{nrec - 1:05d}}}.llrec"
        names = [f"img/{i:05d}.jpg" for i in range(args.images)]

        def cache(tag):
            d = os.path.join(cache_root, tag)
            shutil.rmtree(d, ignore_errors=True)      # each round starts cold
            return d

        sources = {
            "local records": lambda: ll.RecordFileDataset(os.path.join(root, "rec-*.llrec")),
            "http records, ranges": lambda: ll.RecordFileDataset(f"{nginx.url}/{rec}"),
            "http records, cache": lambda: ll.RecordFileDataset(f"{nginx.url}/{rec}", cache_dir=cache("h")),
            "http webdataset, ranges": lambda: ll.WebDataset(f"{nginx.url}/wds-{{0..3}}.tar"),
            "http one object per image": lambda: ll.ImageListDataset(names, labels, root=nginx.url),
            "s3 records, ranges": lambda: ll.RecordFileDataset(f"s3://bench/{rec}", storage_options=so),
            "s3 records, cache": lambda: ll.RecordFileDataset(f"s3://bench/{rec}", storage_options=so,
                                                              cache_dir=cache("s")),
            "s3 one object per image": lambda: ll.ImageListDataset(names, labels, root="s3://bench",
                                                                   storage_options=so),
        }
        chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToCHW()])
        def label(name, depth):
            return name if len(depths) == 1 else f"{name} [io_depth={'default' if depth is None else depth}]"

        results: dict[str, list] = {label(k, d): [] for k in sources for d in depths}
        for _ in range(args.rounds):
            for (name, make), depth in ((item, d) for item in sources.items() for d in depths):
                t0 = time.perf_counter()
                ds = make()
                opened = time.perf_counter() - t0
                loader = ll.DataLoader(ds.transform_first(chain), batch_size=64, shuffle=True, seed=0,
                                       num_threads=args.threads, io_depth=depth)
                rates = []
                for _ in range(args.epochs):
                    t = time.perf_counter()
                    n = sum(len(b[1]) for b in loader)
                    rates.append(n / (time.perf_counter() - t))
                results[label(name, depth)].append((opened, rates[0], rates[-1]))
                loader.close()
                getattr(ds, "close", lambda: None)()
        print(machine_summary())
        print(f"{args.images} photo-like JPEGs (500x375, q90); RRC(224) + flip, uint8 CHW, batch 64, "
              f"{args.threads} threads; median of {args.rounds} rounds; servers on 127.0.0.1, no added latency\n")
        last = f"epoch {args.epochs} img/s"
        print(f"{'source':44s} {'open s':>7s} {'epoch 1 img/s':>14s} {last:>14s}")
        for name, rows in results.items():
            med = [statistics.median(r[k] for r in rows) for k in range(3)]
            print(f"{name:44s} {med[0]:7.2f} {med[1]:14.0f} {med[2]:14.0f}")
    finally:
        nginx.close()
        moto.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cache_root, ignore_errors=True)


if __name__ == "__main__":
    main()
