"""Cold epochs through the shard cache with and without ``ranges_while_caching``, over HTTP.

nginx serves record shards of ImageNet-like photos on 127.0.0.1 with each connection capped at
``--limit-rate`` (nginx's ``limit_rate``: a store's per-connection bandwidth; the default
25 MB/s is about what one connection to an object store in another zone gets). Each
measurement makes ``RecordFileDataset(url, cache_dir=<empty folder>, storage_options=
{"ranges_while_caching": on})`` and runs one shuffled epoch of the RN50 train chain
(RandomResizedCrop(224), flip, CHW uint8; batch 64, 2 threads) consumed by an infinitely fast
model: the cold epoch, from the dataset's construction to the last batch, and its first batch.
Off, a global shuffle's first batch waits for whole shards to arrive; on, the samples of shards
still downloading are read by byte range meanwhile (NOTE [ Samples of a shard still on its way ]
in loaderlib/_extract/remote/files.py). The two settings alternate in ``--rounds`` rounds;
medians are printed. (Against moto's S3 server, which reads a whole object for every ranged
GET, the option is slower: ``objstore_peers.py --ll-ranges``.)

Usage::

    python benchmarks/ranges_while_caching.py [--images 1024] [--rounds 3] [--limit-rate 25m]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import _servers
from _photos import add_data_kind, describe
from _photos import jpegs as make_jpegs
from _report import machine_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    add_data_kind(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit-rate", default="25m", help="nginx's limit_rate per connection (bytes/s, k/m suffixes)")
    ap.add_argument("--shard-mb", type=int, default=24)
    args = ap.parse_args()

    import loaderlib as ll
    from loaderlib import transforms as T

    root = tempfile.mkdtemp(prefix="ll-rwc-")
    jpegs = make_jpegs(args.images, args.data_kind)
    print(machine_summary())
    print(describe(jpegs, args.data_kind), flush=True)
    ll.write_records(os.path.join(root, "rec"), jpegs, [i % 10 for i in range(args.images)],
                     shard_size=args.shard_mb << 20)
    shards = sorted(f for f in os.listdir(root) if f.endswith(".llrec"))
    print(f"{len(shards)} record shards, {sum(map(len, jpegs)) / 1e6:.1f} MB, nginx limit_rate {args.limit_rate} "
          "per connection on 127.0.0.1", flush=True)
    nginx = _servers.NginxServer(root, limit_rate=args.limit_rate)
    url = f"{nginx.url}/rec-{{00000..{len(shards) - 1:05d}}}.llrec"
    chain = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToCHW()])
    rates: dict[bool, list[float]] = {False: [], True: []}
    firsts: dict[bool, list[float]] = {False: [], True: []}
    try:
        for r in range(args.rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                cache = tempfile.mkdtemp(prefix="ll-rwc-cache-")
                try:
                    t0 = time.perf_counter()
                    ds = ll.RecordFileDataset(url, cache_dir=cache, storage_options={"ranges_while_caching": on})
                    loader = ll.DataLoader(ds.transform_first(chain), batch_size=64, shuffle=True, seed=r,
                                           num_threads=2)
                    first, n = None, 0
                    for _x, y in loader:
                        if first is None:
                            first = time.perf_counter() - t0
                        n += len(y)
                    elapsed = time.perf_counter() - t0
                    loader.close()
                    getattr(ds, "close", lambda: None)()
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                rates[on].append(n / elapsed)
                firsts[on].append(first or 0.0)
                print(f"  round {r + 1}: ranges_while_caching={on!s:5}: cold epoch {n / elapsed:7.0f} img/s, "
                      f"first batch {first or 0.0:.2f} s", flush=True)
    finally:
        nginx.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds (cold epoch from the dataset's construction, shuffle=True):")
    for on in (False, True):
        print(f"  ranges_while_caching={on!s:5}: {statistics.median(rates[on]):7.0f} img/s, first batch "
              f"{statistics.median(firsts[on]):.2f} s")
    print(f"  on / off: {statistics.median(rates[True]) / statistics.median(rates[False]):.2f}x")


if __name__ == "__main__":
    main()
