"""Timed epochs for the storage benchmarks (``storage.py`` and ``_remote_bench.py`` both use
them; neither imports the other's module for it)."""

from __future__ import annotations

import os
import time


def evict(paths: list[str]) -> None:
    """Drop the files' clean pages from the page cache."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_epochs(make_epoch, epochs: int, cold_paths: list[str] | None) -> dict:
    """Run ``1 + epochs`` epochs (``make_epoch()`` returns a fresh iterable of batches); the rate
    is over the last ``epochs``, each timed from ``iter()`` to its last batch, and so is the
    process's CPU time per image (every thread of this process: loaderlib's work; a PyTorch
    DataLoader's worker processes are not in it)."""
    seen = 0
    busy = 0.0
    cpu = 0.0
    t_start = time.perf_counter()
    first = None
    for e in range(1 + epochs):
        if cold_paths is not None:
            evict(cold_paths)
        t0 = time.perf_counter()
        c0 = time.process_time()
        n = 0
        for x, _y in make_epoch():
            n += len(x)
            if first is None:
                first = time.perf_counter() - t_start
        if e > 0:
            busy += time.perf_counter() - t0
            cpu += time.process_time() - c0
            seen += n
    return {"images_per_s": seen / busy, "images": seen, "first_batch_s": first,
            "cpu_ms_per_image": 1e3 * cpu / seen}
