"""CPU accounting for the storage probe: this process's CPU time, the busy time of its CPUs, and
the CPU time of the local processes that serve its reads (NOTE [ Read CPU in the ceiling ] in
``probe.py``).

NOTE [ Finding the storage's processes ]
On a machine that other work keeps busy, the busy time of the CPUs cannot tell the storage's
CPU from the other work's: when the probe's threads use less CPU, the other work gets more
(measured on the shared 2-core machine: 0.10-0.24 CPU-ms per read through latencyfs where the
daemon alone used 0.19-0.22). So the probe looks for the processes that serve its reads and
reads their CPU time from ``/proc/PID/stat``:

- a path on a FUSE mount (``/proc/self/mountinfo``, type ``fuse*``): the processes holding
  ``/dev/fuse`` open whose command line names the mount point (a FUSE daemon is started with
  it; when none does and only one process holds ``/dev/fuse``, that one);
- an ``http(s)://`` URL whose host is this machine: the processes listening on its port
  (``/proc/net/tcp``, ``tcp6``; the socket's inode in ``/proc/PID/fd``), then, up to
  ``MAX_HOPS`` times, the local processes listening on ports those processes are connected to
  (a proxy in front of a server: both are the storage).

What it cannot see (kernel threads of a network filesystem, softirq work) is left to the busy
time of the CPUs, which the probe uses only where no process was found, and only when other work
kept less than half a CPU busy in its quiet window (with more, the probe's own pauses hand that
work CPU time that would count as the storage's: 0.13 CPU-ms per read of warm local files at a
load average of 6-9 on 2 cores). This process is never counted as storage (its CPU is the
reader's, counted apart).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import resource
import socket
from collections.abc import Iterable, Sequence

__all__ = ["CpuSample", "comm", "cpu_sample", "storage_pids"]

#: Hops followed from the server a URL names to the local servers behind it.
MAX_HOPS = 3


@dataclasses.dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far (NOTE [ Read CPU in the ceiling ]).

    Attributes
    ----------
    busy : float or None
        Busy time of the CPUs this process may run on, summed (``/proc/stat``: user, nice,
        system, irq, softirq); None where it cannot be read.
    own : float
        This process's CPU time, every thread, user + system.
    storage : float or None
        The CPU time of the storage's local processes (NOTE [ Finding the storage's
        processes ]); None when none was found.
    """

    busy: float | None
    own: float
    storage: float | None = None


def _tick() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def _busy() -> float | None:
    try:
        with open("/proc/stat") as f:
            text = f.read()
    except OSError:
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    total = 0.0
    seen = False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and (mine is None or int(name[3:]) in mine):
            v = [int(x) for x in rest.split()]
            total += v[0] + v[1] + v[2] + v[5] + v[6]     # user nice system irq softirq
            seen = True
    return total / _tick() if seen else None


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread) of process ``pid`` so far; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[11]) + int(rest[12])) / _tick()


def cpu_sample(pids: Sequence[int] = ()) -> CpuSample:
    """The CPU time used so far by this process, by the CPUs of its affinity and by ``pids``."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    storage = None
    if pids:
        storage = sum(c for p in pids if (c := process_cpu_s(p)) is not None)
    return CpuSample(busy=_busy(), own=r.ru_utime + r.ru_stime, storage=storage)


# --------------------------------------------------------------------------- finding the storage


def comm(pid: int) -> str:
    """The name of process ``pid`` (``/proc/PID/comm``), ``"?"`` when gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _pids() -> list[int]:
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []


def _fd_targets(pid: int) -> list[str]:
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def fuse_mount_of(path: str, mountinfo: str | None = None) -> str | None:
    """The mount point of the FUSE filesystem ``path`` lies on, or None."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return None
    real = os.path.abspath(path)   # no lstat: a hung mount must not hang the probe
    best: tuple[str, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = right.split()[0] if right.split() else ""
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best[0] if best is not None and best[1].startswith("fuse") else None


def _fuse_daemons(point: str) -> list[int]:
    holders = [p for p in _pids() if "/dev/fuse" in _fd_targets(p)]
    named = [p for p in holders if point in _cmdline(p)]
    return named or (holders if len(holders) == 1 else [])


def _tcp_table() -> list[tuple[int, int, int, bool]]:
    """(local port, remote port, inode, listening) of the TCP sockets on local addresses'
    loopback or this host (``/proc/net/tcp`` and ``tcp6``)."""
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            v = line.split()
            if len(v) < 10:
                continue
            lport = int(v[1].rsplit(":", 1)[1], 16)
            rport = int(v[2].rsplit(":", 1)[1], 16)
            rows.append((lport, rport, int(v[9]), v[3] == "0A"))
    return rows


def _local_host(host: str) -> bool:
    """Whether ``host`` is this machine: a loopback address, or one this machine can bind."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    for family, _t, _p, _c, addr in infos:
        try:
            if ipaddress.ip_address(addr[0]).is_loopback:
                return True
        except ValueError:
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def servers_of(port: int, table: Iterable[tuple[int, int, int, bool]], sockets: dict[int, set[int]]) -> set[int]:
    """The processes listening on ``port`` and, up to ``MAX_HOPS`` hops, the local servers
    those connect to. ``table``: :func:`_tcp_table`'s rows; ``sockets``: pid -> its socket
    inodes."""
    table = list(table)
    listening: dict[int, set[int]] = {}     # port -> inodes listening
    for lport, _r, inode, listen in table:
        if listen:
            listening.setdefault(lport, set()).add(inode)
    by_inode: dict[int, set[int]] = {}     # a listening socket is shared by a server's workers
    for pid, inodes in sockets.items():
        for i in inodes:
            by_inode.setdefault(i, set()).add(pid)
    found: set[int] = set()
    ports = {port}
    for _ in range(1 + MAX_HOPS):
        new = {pid for p in ports for i in listening.get(p, ()) for pid in by_inode.get(i, ())} - found
        if not new:
            break
        found |= new
        mine = {i for pid in new for i in sockets.get(pid, ())}
        ports = {r for lport, r, inode, listen in table if not listen and inode in mine and r in listening}
    return found


def storage_pids(location: str) -> tuple[int, ...]:
    """This machine's processes that serve reads of ``location`` (a path or an http(s) URL),
    never this process (NOTE [ Finding the storage's processes ])."""
    me = os.getpid()
    if "://" not in location:
        point = fuse_mount_of(location)
        return tuple(p for p in _fuse_daemons(point) if p != me) if point else ()
    from urllib.parse import urlsplit

    u = urlsplit(location)
    if u.scheme not in ("http", "https") or not u.hostname or not _local_host(u.hostname):
        return ()
    port = u.port or (443 if u.scheme == "https" else 80)
    sockets: dict[int, set[int]] = {}
    for pid in _pids():
        inodes = {int(t[8:-1]) for t in _fd_targets(pid) if t.startswith("socket:[")}
        if inodes:
            sockets[pid] = inodes
    return tuple(sorted(p for p in servers_of(port, _tcp_table(), sockets) if p != me))
