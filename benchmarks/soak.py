"""Soak: many epochs and many abandoned iterators per engine; what is left behind.

For each engine (native: an image folder with the fused chain; threads: the same with a
Python step; processes: the same Python step in 2 worker processes) one DataLoader runs
``--epochs`` full epochs, then ``--abandon`` iterators are created, advanced one batch and
dropped. Printed per engine: resident memory growth (VmRSS after the first epoch vs at the
end), and the threads, open file descriptors and shared-memory segments of this process
(created by it and still in ``/dev/shm`` or still mapped) before the loader existed and after
it was closed. Every loader reads ahead (NOTE [ Read-ahead ]): its IO threads count among
the native threads. Expected: RSS growth < 5 MB over 100 epochs, 0 leaked threads (Python or
native), fds or segments.

With ``--remote``, the same soak runs over URLs instead: the images are served by nginx on
127.0.0.1 (started here, as the tests do) and read as an ``ImageListDataset`` of URLs (one
object per image) and as a ``RecordFileDataset`` of URLs (byte ranges); printed besides are
the sockets this process holds after 100 and after all abandoned iterators: the store's
connection pool is one per process and bounded, so a leak shows as growth between the two.
Expected (issue 26): 0 leaked threads, no growth in sockets.

Usage::

    python benchmarks/soak.py [--data DIR] [--epochs 100] [--abandon 1000] [--images 64] [--engines native,...]
                              [--remote]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time

from _report import machine_summary

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


_CREATED: set = set()   # names of the shared-memory blocks this process created


def _track_shm() -> None:
    """Record every shared-memory block the processes engine creates in this process.

    /dev/shm is shared by every process on the machine: counting its files would count
    other programs' segments (a test suite running beside this script, say). A segment this
    process leaked is one it created that is still in /dev/shm or still mapped here."""
    from loaderlib._engines import processes

    init = processes._ShmBlock.__init__

    def tracked(self, nbytes: int, *args, **kwargs) -> None:
        init(self, nbytes, *args, **kwargs)
        _CREATED.add(self.name)

    processes._ShmBlock.__init__ = tracked


def _counts() -> tuple[int, int, int, int]:
    with open("/proc/self/maps") as f:
        mapped = {line.split("/dev/shm/")[1].split()[0] for line in f if "/dev/shm/psm_ll" in line}
    shm = len({n for n in _CREATED if os.path.exists("/dev/shm/" + n)} | (mapped & _CREATED))
    fds = set(os.listdir("/proc/self/fd"))
    # multiprocessing's resource tracker (started by the first shared-memory block, once per
    # process, kept until exit) holds one pipe: not the loader's.
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_fd", None)
    fds.discard(str(tracker))
    # Native threads too (kernel teams, the read-ahead stage's IO threads): the process's tasks.
    return threading.active_count(), len(fds), shm, len(os.listdir("/proc/self/task"))


def _flip(img):
    return img[:, ::-1].copy()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", help="image folder; default: the cached demo dataset")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--abandon", type=int, default=1000)
    p.add_argument("--images", type=int, default=64, help="images per epoch (the first N of the folder)")
    p.add_argument("--engines", default="native,threads,processes", help="comma-separated engines to soak")
    p.add_argument("--remote", action="store_true", help="read the images over HTTP from a local nginx")
    args = p.parse_args()

    from loaderlib.profiling import build_demo_dataset

    import loaderlib as ll
    from loaderlib import transforms as T

    _track_shm()
    root = args.data or str(build_demo_dataset())
    items = ll.ImageFolderDataset(root).items[:args.images]
    paths, labels = [q for q, _ in items], [lab for _, lab in items]
    native = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToCHW()])
    python = T.Compose([T.RandomResizedCrop(64), _flip, T.ToCHW()])
    if args.remote:
        return _soak_remote(args, paths, labels, native, python)
    setups = {
        "native": ({}, native),
        "threads": ({}, python),
        "processes": ({"num_workers": 2}, python),
    }
    print(machine_summary())
    print(f"data: {len(paths)} images from {root}; batch 16; {args.epochs} epochs, then {args.abandon} iterators "
          "each advanced one batch and dropped\n")
    for name, (kw, chain) in setups.items():
        if name not in args.engines.split(","):
            continue
        gc.collect()
        before = _counts()
        t0 = time.perf_counter()
        loader = ll.DataLoader(ll.ImageListDataset(paths, labels).transform_first(chain), batch_size=16,
                               shuffle=True, seed=0, timeout=120, **kw)
        assert loader.engine == name, loader.explain()
        for _ in loader:
            pass
        rss0 = _rss_kib()
        for _ in range(args.epochs - 1):
            for _ in loader:
                pass
        rss1 = _rss_kib()
        for _ in range(args.abandon):
            it = iter(loader)
            next(it)
            del it
        rss2 = _rss_kib()
        loader.close()
        del loader
        gc.collect()
        time.sleep(0.5)   # worker processes, pool threads and detached IO threads finish exiting
        after = _counts()
        print(f"{name:<10} {time.perf_counter() - t0:6.1f} s   RSS after epoch 1 {rss0 / 1024:7.1f} MB, after "
              f"{args.epochs} epochs {rss1 / 1024:7.1f} MB (+{(rss1 - rss0) / 1024:.1f}), after {args.abandon} "
              f"abandoned iterators {rss2 / 1024:7.1f} MB (+{(rss2 - rss1) / 1024:.1f})")
        print(f"{'':<10} threads {before[0]} -> {after[0]} (native included: {before[3]} -> {after[3]}), fds "
              f"{before[1]} -> {after[1]}, shm segments {before[2]} -> {after[2]} (of {len(_CREATED)} this process "
              "created so far)")
    return 0


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _soak_remote(args, paths, labels, native, python) -> int:
    import shutil
    import tempfile

    from _servers import NginxServer

    import loaderlib as ll

    folder = tempfile.mkdtemp(prefix="ll-soak-")
    names = []
    for k, q in enumerate(paths):
        names.append(f"img{k:05d}.jpg")
        shutil.copyfile(q, os.path.join(folder, names[-1]))
    ll.write_records(os.path.join(folder, "rec"), [os.path.join(folder, n) for n in names], labels)
    nginx = NginxServer(folder)
    print(machine_summary())
    print(f"remote: {len(paths)} images over HTTP from nginx on 127.0.0.1; batch 16; {args.epochs} epochs, then "
          f"{args.abandon} iterators each advanced one batch and dropped\n")
    try:
        datasets = {
            "objects": lambda: ll.ImageListDataset(names, labels, root=nginx.url),
            "ranges": lambda: ll.RecordFileDataset(nginx.url + "/rec.llrec"),
        }
        datasets["objects"]()[0]        # the store's runtime and pool exist before counting
        setups = {"native": ({}, native), "threads": ({}, python), "processes": ({"num_workers": 2}, python)}
        for dname, make in datasets.items():
            for name, (kw, chain) in setups.items():
                if name not in args.engines.split(","):
                    continue
                gc.collect()
                before = _counts()
                t0 = time.perf_counter()
                loader = ll.DataLoader(make().transform_first(chain), batch_size=16, shuffle=True, seed=0,
                                       timeout=120, **kw)
                assert loader.engine == name, loader.explain()
                for _ in range(args.epochs):
                    for _ in loader:
                        pass
                socks = []
                for k in range(args.abandon):
                    it = iter(loader)
                    next(it)
                    del it
                    if k + 1 in (min(100, args.abandon), args.abandon):
                        gc.collect()
                        socks.append(_sockets())
                loader.close()
                del loader
                gc.collect()
                time.sleep(0.5)   # worker processes and pool threads finish exiting
                after = _counts()
                print(f"{dname:<8} {name:<10} {time.perf_counter() - t0:6.1f} s   Python threads {before[0]} -> "
                      f"{after[0]}, OS threads {before[3]} -> {after[3]}, fds {before[1]} -> {after[1]}, sockets "
                      f"after {min(100, args.abandon)} / {args.abandon} abandoned iterators: {socks[0]} / {socks[-1]}",
                      flush=True)
    finally:
        nginx.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
