"""This process's threads as the system sees them (NOTE [ Thread names ] in pyx/include/ll_pool.h)."""

from __future__ import annotations

import os


def threads() -> dict[int, str]:
    """This process's threads: system thread id -> system name, as ``top -H`` shows them. A
    thread that ends while they are listed is left out (a joined Python thread's last
    instructions may still show in /proc for a moment)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:   # the thread ended while listing
            pass
    return out


def still_running(tids, timeout: float = 30.0) -> set[int]:
    """Those of ``tids`` still listed after waiting up to ``timeout`` seconds for them to go.
    A joined thread's system task can outlive its join by a moment on a loaded machine (its
    exit is the kernel's last step, after the wake that ends the join)."""
    import time

    left = set(tids) & set(threads())
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left &= set(threads())
    return left
