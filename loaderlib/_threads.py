"""Thread-count policy: decided once in Python, passed down to every kernel.

NOTE [ OpenMP after fork ]
With GNU OpenMP, a child process forked after its parent ran a parallel region hangs in
its next parallel region when that region uses more than one thread (libgomp's pool does
not survive fork). PyTorch's DataLoader workers fork, so a user who wraps loaderlib in one
would hang. An at-fork handler marks the child, and every kernel call in such a child
runs single-threaded, with a one-time warning saying why and what to do instead.
"""

from __future__ import annotations

import os
import threading
import time
import warnings

from ._checks import check_int

_lock = threading.Lock()
_parallel_used = False      # this process has run an OpenMP region with > 1 thread
_forked_child = False       # we are a child forked after such a region
_warned = False


def _after_fork_in_child() -> None:
    global _forked_child, _warned
    if _parallel_used:
        _forked_child = True
        _warned = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _affinity_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup quota allows this process (``cpu.max``, or v1's CFS quota), or None.

    A container limited to 4 CPUs on a 64-core host still sees 64 CPUs in its affinity mask;
    only the quota says 4.
    """
    candidates = [(os.path.join(root, "cpu.max"), None)]
    candidates += [(os.path.join(root, d, "cpu.cfs_quota_us"), os.path.join(root, d, "cpu.cfs_period_us"))
                   for d in ("cpu", "cpu,cpuacct")]
    for quota_path, period_path in candidates:
        try:
            with open(quota_path) as f:
                text = f.read().split()
            if period_path is None:
                quota, period = text[0], (text[1] if len(text) > 1 else "100000")
            else:
                with open(period_path) as f:
                    quota, period = text[0], f.read().split()[0]
        except (OSError, IndexError):
            continue
        if quota in ("max", "-1"):
            return None
        try:
            q, p = float(quota), float(period)
        except ValueError:
            continue
        if q > 0 and p > 0:
            return q / p
    return None


#: How long a read of the cgroup quota is reused (seconds): ``DataLoader.num_threads`` asks
#: for the default on every access, and the quota files are three opens each time.
QUOTA_TTL_S = 1.0
_clock = time.monotonic
_quota_cache: tuple[int, float, float | None] | None = None   # (pid, when read, quota)


def _cgroup_quota_cached() -> float | None:
    global _quota_cache
    pid, now = os.getpid(), _clock()
    c = _quota_cache
    if c is not None and c[0] == pid and now - c[1] < QUOTA_TTL_S:
        return c[2]
    quota = cgroup_cpu_limit()
    _quota_cache = (pid, now, quota)
    return quota


def available_cpus() -> int:
    """CPUs this process may run on: the affinity mask, capped by the cgroup CPU quota (read
    at most once per ``QUOTA_TTL_S`` seconds per process)."""
    n = _affinity_cpus()
    quota = _cgroup_quota_cached()
    if quota is not None:
        n = min(n, max(1, int(-(-quota // 1))))   # a quota of 2.5 CPUs keeps 3 threads busy
    return n


def name_native_thread(name: str) -> None:
    """Give the calling thread the operating system name ``name`` (15 characters kept), as
    ``top -H``, py-spy and gdb show it (NOTE [ Thread names ] in ``pyx/include/ll_pool.h``):
    a Python thread's ``threading`` name is not the system's, which stays "python"."""
    from ._ext import _chain  # the compiled module loads with the engines, not with this module

    _chain.name_thread(name.encode("ascii", "replace")[:15])


def default_num_threads() -> int:
    """The default thread count: ``LOADERLIB_NUM_THREADS`` if set, else the available CPUs
    (:func:`available_cpus`) shared among the ranks on this node (``LOCAL_WORLD_SIZE``, set by
    torchrun), at least 1."""
    env = os.environ.get("LOADERLIB_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"LOADERLIB_NUM_THREADS must be an integer, got {env!r}") from None
    n = available_cpus()
    ranks = os.environ.get("LOCAL_WORLD_SIZE")
    if ranks:
        try:
            n //= max(1, int(ranks))
        except ValueError:
            raise ValueError(f"LOCAL_WORLD_SIZE must be an integer, got {ranks!r}") from None
    return max(1, n)


def resolve_num_threads(num_threads: int | None) -> int:
    """The thread count a kernel call should use.

    ``None`` means the default (``LOADERLIB_NUM_THREADS`` or the available CPUs). In a
    child forked after a parallel region, always 1 (see NOTE [ OpenMP after fork ]).
    """
    global _parallel_used, _warned
    if num_threads is None:
        n = default_num_threads()
    else:
        n = check_int(num_threads, "num_threads", minimum=1)
    if _forked_child:
        if n > 1 and not _warned:
            _warned = True
            warnings.warn(
                "loaderlib: this process was forked after its parent ran OpenMP kernels; GNU OpenMP "
                "would hang here, so loaderlib kernels run single-threaded in this process. Use "
                "multiprocessing start method 'spawn' or 'forkserver' (or loaderlib's own workers) "
                "to get parallel kernels in child processes.",
                RuntimeWarning,
                stacklevel=3,
            )
        return 1
    if n > 1:
        with _lock:
            _parallel_used = True
    return n
