"""A shuffled token corpus behind HTTP: first batch and bytes fetched, by range against whole files.

nginx serves ``--files`` flat uint16 token files of ``--mb`` MB each on 127.0.0.1, each
connection capped at ``--limit-rate`` (nginx's ``limit_rate``: one connection's bandwidth to an
object store; 0 for none). Each measurement opens ``TokenDataset(url, 2048, eos_id=1,
cache_dir=<empty folder>, remote_reads=MODE)`` and reads a shuffled loader (batch 64, 2 threads)
by an infinitely fast model: the time from the dataset's construction to the first batch and
to batch ``--batches``, and the bytes the store sent by then (``"ranges"``: the chunks fetched;
``"files"``: what the shard cache's folder holds, downloads under way included). The modes
alternate in ``--rounds`` rounds; medians are printed (NOTE [ Token files read by range ] in
loaderlib/_datasets/tokens/ranges.py).

Usage::

    python benchmarks/token_ranges.py [--files 8] [--mb 64] [--limit-rate 25m] [--rounds 2] [--batches 50] [--s3]
        [--cache-limit 32MB]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import _servers
import numpy as np


def _disk(folder: str) -> int:
    total = 0
    for name in os.listdir(folder):
        try:
            total += os.stat(os.path.join(folder, name)).st_blocks * 512
        except OSError:
            pass
    return total


def one(url: str, mode: str, batches: int, seed: int, so: dict | None,
        limit: str | None = None) -> tuple[float, float, int, int]:
    import loaderlib as ll

    cache = tempfile.mkdtemp(prefix="ll-tokr-cache-")
    try:
        t0 = time.perf_counter()
        ds = ll.TokenDataset(url, 2048, eos_id=1, cache_dir=cache, remote_reads=mode, storage_options=so,
                             cache_limit=limit if mode == "ranges" else None)
        loader = ll.DataLoader(ds, batch_size=64, shuffle=True, seed=seed, num_threads=2)
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        got = ds._ranges.fetched_bytes if ds._ranges is not None else _disk(cache)
        for _ in range(batches - 1):
            next(it)
        last = time.perf_counter() - t0
        total = ds._ranges.fetched_bytes if ds._ranges is not None else _disk(cache)
        loader.close()
        ds.close()
        return first, last, got, total
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--limit-rate", default="25m")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--cache-limit", default=None, help="cache_limit of the ranges runs (e.g. 32MB)")
    ap.add_argument("--s3", action="store_true", help="moto's S3 server instead of nginx (no rate limit; it "
                    "reads a whole object for every ranged GET, so keep --mb small)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ll-tokr-")
    rng = np.random.default_rng(0)
    for k in range(args.files):
        rng.integers(2, 50000, size=args.mb << 19, dtype=np.uint16).tofile(os.path.join(root, f"part-{k}.bin"))
    so = None
    if args.s3:
        server: _servers.MotoServer | _servers.NginxServer = _servers.MotoServer()
        server.upload_folder("tok", root)
        so = server.storage_options
        url = f"s3://tok/part-{{0..{args.files - 1}}}.bin"
    else:
        server = _servers.NginxServer(root, limit_rate=None if args.limit_rate in ("0", "") else args.limit_rate)
        url = f"{server.url}/part-{{0..{args.files - 1}}}.bin"
    rows: dict[str, list[tuple[float, float, int, int]]] = {"ranges": [], "files": []}
    try:
        for r in range(args.rounds):
            for mode in ("ranges", "files"):
                rows[mode].append(one(url, mode, args.batches, seed=r, so=so, limit=args.cache_limit))
                f, last, got, total = rows[mode][-1]
                print(f"round {r} {mode:6s}: first batch {f:7.3f} s ({got / 1e6:8.1f} MB), "
                      f"{args.batches} batches {last:7.3f} s ({total / 1e6:8.1f} MB)", flush=True)
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)
    where = "moto S3" if args.s3 else f"nginx, limit_rate {args.limit_rate}"
    print(f"\n{args.files} files x {args.mb} MB, {where}, batch 64 x 2048 tokens, "
          f"medians of {args.rounds}:")
    for mode, rs in rows.items():
        med = [statistics.median(x[k] for x in rs) for k in range(4)]
        print(f"  {mode:6s}: first batch {med[0]:.3f} s, {med[2] / 1e6:.1f} MB; {args.batches} batches "
              f"{med[1]:.3f} s, {med[3] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
