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
