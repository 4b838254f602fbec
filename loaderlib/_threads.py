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
import warnings

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


def available_cpus() -> int:
    """CPUs this process may run on (affinity and cgroup CPU sets respected)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_num_threads() -> int:
    env = os.environ.get("LOADERLIB_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"LOADERLIB_NUM_THREADS must be an integer, got {env!r}") from None
    return available_cpus()


def resolve_num_threads(num_threads: int | None) -> int:
    """The thread count a kernel call should use.

    ``None`` means the default (``LOADERLIB_NUM_THREADS`` or the available CPUs). In a
    child forked after a parallel region, always 1 (see NOTE [ OpenMP after fork ]).
    """
    global _parallel_used, _warned
    if num_threads is None:
        n = default_num_threads()
    else:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")
        n = num_threads
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
