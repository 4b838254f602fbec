"""Slow storage on demand: mount a folder through ``latencyfs`` (``benchmarks/latencyfs.c``), a
multi-threaded C FUSE passthrough that charges each file a latency with jitter and bypasses
the page cache, so every read of every epoch pays it.

::

    from benchmarks._latencyfs import mount

    with mount("photos/", latency_ms=4) as m:   # +-50% jitter by default
        ...read files under m.path...
    print(m.report)                              # what the daemon served

The daemon is compiled on first use (``cc ... $(pkg-config --cflags --libs fuse3)``); when
libfuse3's headers or ``fusermount3`` are missing, Debian's ``fuse3`` and ``libfuse3-dev`` are
installed with apt-get (as root). Whatever stops the ``with`` block (an exception, Ctrl-C)
unmounts; if the process itself dies, the daemon gets SIGTERM and unmounts
(``--die-with-parent``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "latencyfs.c")
BIN_DIR = os.path.join(HERE, "out", "bin")
WHERE = ("split", "open", "first-read", "every-read")


class LatencyFSError(RuntimeError):
    """latencyfs could not be built, mounted or unmounted; the message says why."""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)


def _have_fuse3() -> bool:
    return (shutil.which("fusermount3") is not None and shutil.which("pkg-config") is not None
            and _run(["pkg-config", "--exists", "fuse3"]).returncode == 0)


def ensure_fuse3() -> None:
    """Make sure ``fusermount3`` and libfuse3's headers are present, installing Debian's
    ``fuse3`` and ``libfuse3-dev`` with apt-get when they are not (root only)."""
    if _have_fuse3():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise LatencyFSError("libfuse3 is missing: install fuse3 and libfuse3-dev "
                             "(apt-get install fuse3 libfuse3-dev pkg-config)")
    cmd = ["apt-get", "install", "-y", "-q", "fuse3", "libfuse3-dev", "pkg-config"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    res = _run(cmd, env=env)
    if res.returncode != 0:   # a stale package index: refresh it once
        _run(["apt-get", "update", "-q"], env=env)
        res = _run(cmd, env=env)
    if res.returncode != 0 or not _have_fuse3():
        raise LatencyFSError(f"could not install fuse3 and libfuse3-dev with apt-get:\n{res.stdout}{res.stderr}")


def build(out_dir: str = BIN_DIR) -> str:
    """Compile ``latencyfs.c`` (once; again when the source is newer). Returns the binary's path."""
    exe = os.path.join(out_dir, "latencyfs")
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(SOURCE):
        return exe
    ensure_fuse3()
    os.makedirs(out_dir, exist_ok=True)
    flags = _run(["pkg-config", "--cflags", "--libs", "fuse3"]).stdout.split()
    # Several processes may build at once: each compiles to its own name, then renames.
    tmp = f"{exe}.{os.getpid()}.tmp"
    res = _run(["cc", "-O2", "-Wall", "-Wextra", "-o", tmp, SOURCE, *flags])
    if res.returncode != 0:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise LatencyFSError(f"compiling {SOURCE} failed:\n{res.stderr}")
    os.replace(tmp, exe)
    return exe


def _unmount(path: str) -> str:
    """fusermount3 -u, retried while the mount is busy (a reader still closing); lazily at last.
    Returns an error message, or "" on success."""
    res = None
    for _ in range(50):
        res = _run(["fusermount3", "-u", path])
        if res.returncode == 0 or not os.path.ismount(path):
            return ""
        time.sleep(0.1)
    res = _run(["fusermount3", "-u", "-z", path])
    return "" if res.returncode == 0 else res.stderr.strip() or "fusermount3 -u failed"


@dataclass
class Mount:
    """A mounted latencyfs: ``path`` is the mountpoint (also via ``os.fspath``), ``pid`` the
    daemon's process id; ``report`` is the daemon's summary of what it served (opens, reads, bytes, time slept, peak concurrency),
    filled in after unmounting."""

    path: str
    source: str
    latency_ms: float
    jitter: float
    where: str
    threads: int
    report: str = field(default="", init=False)
    pid: int = field(default=0, init=False)   # the daemon's process id (its CPU time is its own)

    def __fspath__(self) -> str:
        return self.path

    def describe(self) -> str:
        return (f"latencyfs over {self.source}: {self.latency_ms:g} ms per file +-{self.jitter:.0%} jitter "
                f"(charged: {self.where}), direct_io, {self.threads} daemon threads")


@contextlib.contextmanager
def mount(source: str, latency_ms: float, jitter: float = 0.5, where: str = "split", threads: int = 512,
          mountpoint: str | None = None, timeout: float = 20.0) -> Iterator[Mount]:
    """Serve ``source`` read-only at a fresh mountpoint with ``latency_ms`` per file.

    Parameters
    ----------
    source : str
        The folder to serve.
    latency_ms : float
        Mean latency charged per file; ``0`` gives the bare FUSE path.
    jitter : float
        Each charge is ``latency_ms`` times a uniform factor in ``[1 - jitter, 1 + jitter]``.
    where : {"split", "open", "first-read", "every-read"}
        Where the latency is charged (see ``latencyfs.c``): ``split`` puts half at open and half
        at the first read of each open file, so every reader pays one latency per file.
    threads : int
        Daemon threads (each request sleeps on its own thread).
    mountpoint : str, optional
        An empty folder to mount on; by default a temporary folder, removed afterwards.
    timeout : float
        Seconds to wait for the mount to appear.

    Raises
    ------
    LatencyFSError
        If the daemon cannot be built or mounted; the message has the daemon's own reason.
    """
    if where not in WHERE:
        raise ValueError(f"where={where!r}: expected one of {WHERE}")
    exe = build()
    if shutil.which("fusermount3") is None:
        ensure_fuse3()
    source = os.path.abspath(source)
    own_dir = mountpoint is None
    path = tempfile.mkdtemp(prefix="latencyfs-") if own_dir else os.path.abspath(mountpoint)
    m = Mount(path, source, float(latency_ms), float(jitter), where, int(threads))
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen([exe, f"--latency-ms={latency_ms}", f"--jitter={jitter}", f"--where={where}",
                                 f"--threads={threads}", "--die-with-parent", source, path],
                                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
        m.pid = proc.pid
        try:
            deadline = time.monotonic() + timeout
            while not os.path.ismount(path):
                if proc.poll() is not None:
                    log.seek(0)
                    raise LatencyFSError(f"latencyfs exited with code {proc.returncode} before mounting {source} on "
                                         f"{path}: {log.read().strip() or '(no message)'}")
                if time.monotonic() > deadline:
                    raise LatencyFSError(f"latencyfs did not mount {path} within {timeout:g} s")
                time.sleep(0.01)
            yield m
        finally:
            problem = _unmount(path) if os.path.ismount(path) else ""
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.seek(0)
            m.report = log.read().strip()
            if own_dir and not os.path.ismount(path):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            if problem:
                raise LatencyFSError(f"could not unmount {path}: {problem}")
