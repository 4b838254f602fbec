"""The ResNet-50 training pipeline read from an image folder, record shards and WebDataset shards.

The same JPEGs (the demo dataset, or ``--data``) are packed once into record shards
(``ll.write_records(..., shard_size)``) and into WebDataset tar shards (written with the
standard library's ``tarfile``: ``KEY.jpg`` + ``KEY.cls`` members), in a temporary folder.
Each source then feeds the same DataLoader (RandomResizedCrop(224), flip, Normalize, CHW
float32; batch 64; shuffled; 2 threads by default) consumed by an infinitely fast model.
Rounds are interleaved (folder, records, webdataset, folder, ...) and medians printed, with
each source's ratio to the folder. Expected (issue 10): shards at least as fast as the folder.

Usage::

    python benchmarks/shards.py [--data DIR] [--rounds 5] [--threads N] [--shard-size 16MB]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time

from _report import machine_summary, med

HERE = os.path.dirname(os.path.abspath(__file__))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _write_tars(items, root: str, per_shard: int) -> list[str]:
    paths = []
    for s in range(0, len(items), per_shard):
        path = os.path.join(root, f"wds-{s // per_shard:05d}.tar")
        with tarfile.open(path, "w") as tf:
            for k, (p, label) in enumerate(items[s:s + per_shard]):
                key = f"sample{s + k:07d}"
                with open(p, "rb") as f:
                    image = f.read()
                for name, data in ((f"{key}.jpg", image), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _epoch(loader) -> float:
    n = 0
    t0 = time.perf_counter()
    for images, _labels in loader:
        n += images.shape[0]
    return n / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", help="image folder; default: the cached demo dataset")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--shard-size", default="16MB")
    args = p.parse_args()

    from loaderlib.profiling import build_demo_dataset

    import loaderlib as ll
    from loaderlib import transforms as T
    from loaderlib.records import parse_size

    root = args.data or str(build_demo_dataset())
    threads = args.threads or ll.available_cpus()
    folder = ll.ImageFolderDataset(root)
    chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(mean=MEAN, std=STD),
                       T.ToCHW()])
    with tempfile.TemporaryDirectory() as tmp:
        paths = [q for q, _ in folder.items]
        ll.write_records(os.path.join(tmp, "rec"), paths, folder.labels, shard_size=args.shard_size)
        records = ll.RecordFileDataset(os.path.join(tmp, "rec-*.llrec"))
        avg = max(1, sum(os.path.getsize(q) for q in paths) // len(paths))
        tars = _write_tars(folder.items, tmp, max(1, parse_size(args.shard_size) // avg))
        wds = ll.WebDataset(tars)
        sources = {"image folder": folder, "record shards": records, "WebDataset shards": wds}
        loaders = {name: ll.DataLoader(ds.transform_first(chain), batch_size=64, shuffle=True, seed=0,
                                       num_threads=threads) for name, ds in sources.items()}
        for loader in loaders.values():
            assert loader.engine == "native", loader.explain()
            _epoch(loader)   # warm the page cache and the arena
        rates = {name: [] for name in loaders}
        for _ in range(args.rounds):
            for name, loader in loaders.items():
                rates[name].append(_epoch(loader))
        print(machine_summary())
        print(f"data: {len(folder)} JPEGs from {root}; {len(records.paths)} record shards, {len(tars)} tar shards of "
              f"about {args.shard_size}; ResNet-50 train chain, float32 CHW, batch 64, {threads} threads; "
              f"{args.rounds} interleaved rounds of one epoch each\n")
        base = med(rates["image folder"])
        for name, xs in rates.items():
            print(f"{name:<18} " + "  ".join(f"{x:7.0f}" for x in xs) + f"   median {med(xs):7.0f} img/s   "
                  f"{med(xs) / base:.2f}x the folder")
        for loader in loaders.values():
            loader.close()
        records.close()
        wds.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
