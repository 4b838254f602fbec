"""Timed epochs for the storage benchmarks (``storage.py`` and ``_remote_bench.py`` both use
them; neither imports the other's module for it)."""

from __future__ import annotations

import os
import statistics
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
    starts: list[float] = []   # per timed epoch: iter() to its first batch (the boundary wait)
    gaps: list[float] = []     # between batches inside the timed epochs
    for e in range(1 + epochs):
        if cold_paths is not None:
            evict(cold_paths)
        t0 = time.perf_counter()
        c0 = time.process_time()
        n = 0
        last = None
        for x, _y in make_epoch():
            now = time.perf_counter()
            n += len(x)
            if first is None:
                first = now - t_start
            if e > 0:
                if last is None:
                    starts.append(now - t0)
                else:
                    gaps.append(now - last)
            last = now
        if e > 0:
            busy += time.perf_counter() - t0
            cpu += time.process_time() - c0
            seen += n
    return {"images_per_s": seen / busy, "images": seen, "first_batch_s": first,
            "cpu_ms_per_image": 1e3 * cpu / seen,
            # NOTE [ Batches in memory ]: an infinitely fast model's wait at each epoch start,
            # against its wait between batches mid-epoch.
            "boundary": boundary_waits(starts, gaps, busy)}


def boundary_waits(starts: list[float], gaps: list[float], window: float) -> dict:
    """The consumer's waits at epoch starts against its waits mid-epoch (seconds in): ``share``
    of the window spent waiting for first batches, ``excess`` the share spent waiting at epoch
    starts beyond the median wait between two batches mid-epoch (an infinitely fast model waits
    for every batch of a loader-bound run; what the boundary adds is the excess)."""
    gap = statistics.median(gaps) if gaps else 0.0
    return {"share": sum(starts) / window, "excess": sum(max(0.0, s - gap) for s in starts) / window,
            "start_ms": 1e3 * statistics.median(starts), "gap_ms": 1e3 * gap, "starts": len(starts)}
