"""Which hardware threads share a physical core: the CPU orders for pinned scaling runs.

Read from ``/sys/devices/system/cpu/cpuN/topology`` (``physical_package_id``, ``core_id``,
``thread_siblings_list``), the same source ``lscpu -e`` prints, for the CPUs this process may
run on. ``benchmarks/device_check.py`` pins ``benchmarks/scaling.py`` to one hardware thread per
physical core first (:func:`physical_first`), then to whole cores, both of their threads
(:func:`siblings_packed`), so efficiency per physical core and what the second hardware thread
of a core adds come out apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SYSFS = "/sys/devices/system/cpu"


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's CPU list format) as a sorted list of CPU numbers."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.update(range(int(lo), int(hi) + 1))
        else:
            out.add(int(part))
    return sorted(out)


@dataclass(frozen=True)
class Core:
    """One physical core: its package, its id there, and its hardware threads (CPU numbers)
    that this process may use, lowest first."""

    package: int
    core: int
    cpus: tuple[int, ...]


def cores(allowed: list[int] | None = None, sysfs: str = SYSFS) -> list[Core]:
    """The physical cores holding the ``allowed`` CPUs (default: this process's affinity),
    ordered by package and core id. A CPU whose topology cannot be read counts as a core of
    its own."""
    cpus = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    groups: dict[tuple, list[int]] = {}
    for cpu in cpus:
        base = os.path.join(sysfs, f"cpu{cpu}", "topology")
        try:
            with open(os.path.join(base, "thread_siblings_list")) as f:
                siblings = tuple(parse_cpu_list(f.read()))
            with open(os.path.join(base, "physical_package_id")) as f:
                package = int(f.read())
            with open(os.path.join(base, "core_id")) as f:
                core = int(f.read())
        except (OSError, ValueError):
            siblings, package, core = (cpu,), -1, cpu
        groups.setdefault((package, core, siblings), []).append(cpu)
    out = [Core(package, core, tuple(sorted(c))) for (package, core, _s), c in groups.items()]
    return sorted(out, key=lambda c: (c.package, c.core, c.cpus))


def physical_first(cs: list[Core]) -> list[int]:
    """One hardware thread of every core, then the second thread of every core, and so on:
    the first ``n`` CPUs are ``n`` distinct physical cores while ``n <= len(cs)``."""
    order: list[int] = []
    for k in range(max((len(c.cpus) for c in cs), default=0)):
        order += [c.cpus[k] for c in cs if len(c.cpus) > k]
    return order


def siblings_packed(cs: list[Core]) -> list[int]:
    """Core after core, every hardware thread of each: the first ``n`` CPUs fill ``n / t`` whole
    cores of ``t`` threads."""
    return [cpu for c in cs for cpu in c.cpus]


def threads_per_core(cs: list[Core]) -> int:
    """The hardware threads of the fullest core (1 without SMT)."""
    return max((len(c.cpus) for c in cs), default=0)
