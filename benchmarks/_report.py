"""Shared helpers for the benchmarks: what machine and versions a figure came from, and
robust timing (interleaved rounds, median)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def machine_summary() -> str:
    """One paragraph: CPU model, cores usable, Python, numpy, OpenCV, loaderlib build."""
    import cv2
    import numpy as np

    import loaderlib as ll

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = ll.build_info()
    return (
        f"machine: {cpu}; {len(os.sched_getaffinity(0))} usable cores; {platform.system()} {platform.release()}\n"
        f"python {platform.python_version()}, numpy {np.__version__}, opencv {cv2.__version__}, "
        f"loaderlib {ll.__version__} (OpenMP {'on' if info['openmp'] else 'OFF'}, "
        f"libjpeg-turbo {info['libjpeg_turbo_version']}, SIMD {'on' if info['simd'] else 'off'})"
    )


def median_rate(fns: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Run each callable once per round, interleaved (so drift hits all alike); each
    returns the number of items it processed. Returns items/s per round per name."""
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t0))
    return rates


def med(xs: list[float]) -> float:
    return statistics.median(xs)
