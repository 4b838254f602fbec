"""obstore vs fsspec (s3fs / HTTPFileSystem) on loopback servers: the measurement behind
NOTE [ Protocol library ] in ``loaderlib/_extract/remote/store.py``.

Shard-sized files (``--shards`` x ``--shard-mb``) are served by nginx (HTTP, range
requests) and uploaded to moto's S3 server. For each library and server:
- ranges: ``--ranges`` random JPEG-sized byte ranges (``--range-kb``) at concurrency 1, 16
  and 64 (that many Python threads each issuing one blocking request at a time: the shape
  of the loader's read-ahead stage calling ``reader.read`` from its threads), and the same
  ranges in one batched call (obstore ``get_ranges_async`` under a semaphore / fsspec
  ``cat_ranges``);
- whole: every shard fetched whole at concurrency 1, 16 and 64.
Printed: MB/s and requests/s, median of ``--rounds``; CPU seconds of this process per GB.
moto's server is Python (FACTS: about 365 small objects/s), so its rows say more about moto
than about the client; nginx's rows measure the clients.

Usage::

    python benchmarks/remote_protocols.py [--shards 8] [--shard-mb 16] [--ranges 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import _servers


def _threads(fn, jobs, conc):
    if conc == 1:
        return [fn(*j) for j in jobs]
    with ThreadPoolExecutor(conc) as ex:
        return list(ex.map(lambda j: fn(*j), jobs))


class Obstore:
    name = "obstore"

    def __init__(self, base: str, s3: dict | None):
        import obstore.store as s

        if s3 is None:
            self.store = s.HTTPStore.from_url(base, client_options={"allow_http": True})
            self.prefix = ""
        else:
            self.store = s.S3Store(s3["bucket"], endpoint=s3["endpoint_url"], access_key_id=s3["key"],
                                   secret_access_key=s3["secret"], region="us-east-1",
                                   client_options={"allow_http": True})

    def range(self, path, start, end):
        import obstore

        return obstore.get_range(self.store, path, start=start, end=end)

    def whole(self, path):
        import obstore

        return obstore.get(self.store, path).bytes()

    def batched(self, jobs, conc):
        import obstore

        async def go():
            sem = asyncio.Semaphore(conc)

            async def one(p, s, e):
                async with sem:
                    return await obstore.get_range_async(self.store, p, start=s, end=e)

            return await asyncio.gather(*(one(*j) for j in jobs))

        return asyncio.run(go())


class Fsspec:
    name = "fsspec"

    def __init__(self, base: str, s3: dict | None):
        import fsspec

        if s3 is None:
            self.fs = fsspec.filesystem("http", skip_instance_cache=True)
            self.base = base + "/"
        else:
            self.fs = fsspec.filesystem("s3", skip_instance_cache=True, key=s3["key"], secret=s3["secret"],
                                        client_kwargs={"endpoint_url": s3["endpoint_url"],
                                                       "region_name": "us-east-1"})
            self.base = s3["bucket"] + "/"

    def range(self, path, start, end):
        return self.fs.cat_file(self.base + path, start=start, end=end)

    def whole(self, path):
        return self.fs.cat_file(self.base + path)

    def batched(self, jobs, conc):
        return self.fs.cat_ranges([self.base + p for p, _, _ in jobs], [s for _, s, _ in jobs],
                                  [e for _, _, e in jobs], batch_size=conc)


def _time(fn):
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mb", type=int, default=16)
    ap.add_argument("--ranges", type=int, default=512)
    ap.add_argument("--range-kb", type=int, default=110)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", default="1,16,64")
    args = ap.parse_args()
    concs = [int(c) for c in args.conc.split(",")]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        names = []
        for i in range(args.shards):
            name = f"part-{i:04d}.bin"
            with open(os.path.join(root, name), "wb") as f:
                f.write(os.urandom(args.shard_mb << 20))
            names.append(name)
        size = args.shard_mb << 20
        rlen = args.range_kb << 10
        jobs = []
        for _ in range(args.ranges):
            s = rng.randrange(0, size - rlen)
            jobs.append((rng.choice(names), s, s + rlen))
        nginx = _servers.NginxServer(root)
        moto = _servers.MotoServer()
        try:
            moto.upload_folder("bench", root)
            s3 = {"bucket": "bench", "endpoint_url": moto.endpoint_url, "key": moto.key, "secret": moto.secret}
            print(f"{args.shards} shards x {args.shard_mb} MB; {args.ranges} ranges of {args.range_kb} KB; "
                  f"median of {args.rounds}")
            print(f"{'server':6s} {'library':8s} {'what':8s} {'conc':>4s} {'MB/s':>8s} {'req/s':>8s} {'CPU s/GB':>9s}")
            for server, s3opt, base in (("nginx", None, nginx.url), ("moto", s3, None)):
                for cls in (Obstore, Fsspec):
                    lib = cls(base, s3opt)
                    lib.range(*jobs[0])          # warm the client (connection pool, credentials)
                    for what in ("ranges", "batched", "whole"):
                        for conc in concs:
                            if what == "whole" and conc > args.shards:
                                continue
                            if what == "ranges":
                                fn = lambda lib=lib, conc=conc: _threads(lib.range, jobs, conc)
                                nreq, nbytes = len(jobs), len(jobs) * rlen
                            elif what == "batched":
                                fn = lambda lib=lib, conc=conc: lib.batched(jobs, conc)
                                nreq, nbytes = len(jobs), len(jobs) * rlen
                            else:
                                fn = lambda lib=lib, conc=conc: _threads(lib.whole, [(n,) for n in names], conc)
                                nreq, nbytes = len(names), len(names) * size
                            walls, cpus = [], []
                            for _ in range(args.rounds):
                                wall, cpu, out = _time(fn)
                                assert sum(len(memoryview(b)) for b in out) == nbytes
                                walls.append(wall)
                                cpus.append(cpu)
                            w = statistics.median(walls)
                            print(f"{server:6s} {lib.name:8s} {what:8s} {conc:4d} {nbytes / w / 1e6:8.0f} "
                                  f"{nreq / w:8.0f} {statistics.median(cpus) / (nbytes / 1e9):9.2f}", flush=True)
        finally:
            nginx.close()
            moto.close()


if __name__ == "__main__":
    main()
